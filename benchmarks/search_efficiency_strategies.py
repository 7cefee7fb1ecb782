"""The search strategies a replay compares, each run against a measured table.

autotune's sampler (both as the best it believes and as what a run exports after its
confirmation round), Optuna's TPE and random samplers under the tuner's rules, and a
re-implementation of DeepSpeed's autotuner "fast" strategy; plus the confirmation rule the
replay ranks contenders by.
"""

from __future__ import annotations

import math
import statistics

from autotune.run import ReservePolicy, SearchState
from autotune.study import confirmation as confirm
from benchmarks.search_efficiency_table import Models, Search, Table, table_space


def run_autotune(
    table: Table, search: Search, max_probes: int, models: Models, *, confirming: bool = False
) -> None:
    """autotune's search for ``max_probes``; ``confirming``: less the confirmation round's
    reserve, held back by the tuner's own :class:`~autotune.run.budget.ReservePolicy` (counted
    in probes: every probe takes one unit of the budget)."""
    from autotune.run import CandidatePolicy, History

    policy = CandidatePolicy(
        table.candidates, cost=models.cost(), may_fit=search.may_fit, mode="model"
    )
    reserve = ReservePolicy(enabled=confirming)
    history = History()
    while True:
        estimates = sorted(
            ((v, 1.96 * table.noise * v) for v in search.measured.values()), reverse=True
        )
        state = SearchState(
            feasible=len(search.measured),
            stages_covered=policy.covered(history),
            contenders=len(confirm.pick_contenders(estimates)),
            full_probe_s=1.0,
            probe_s=1.0,
            budget_s=float(max_probes),
        )
        held = reserve.reserve_s(state)
        if search.probes >= max_probes - math.floor(held):
            break
        best = max(search.measured.values(), default=0.0)
        if reserve.settled(state, promising=policy.promising(history, (0, best))):
            break  # nothing promising left on a budget short of the round's plan
        pick = policy.choose(history)
        if pick is None:
            break
        status, value = search.probe(pick)
        step_s = pick.train_batch_size / value if value else None
        history.add(pick, status, step_s)


def run_optuna(table: Table, search: Search, max_probes: int, sampler_name: str) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    seed = search.rng.randrange(2**31)
    sampler = (
        optuna.samplers.TPESampler(seed=seed)
        if sampler_name == "tpe"
        else optuna.samplers.RandomSampler(seed=seed)
    )
    space = table_space(table)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    keys = {c.key for c in table.candidates}
    in_a_row = 0
    asked = 0
    while search.probes < max_probes and asked < 50 * max_probes:
        asked += 1
        if in_a_row >= 3:  # the tuner's rule: hand the sampler an unseen candidate
            unseen = [c for c in table.candidates if c.key not in search.status]
            if not unseen:
                break
            study.enqueue_trial(space.params_of(search.rng.choice(unseen)))
            in_a_row = 0
        trial = study.ask()
        candidate = space.suggest(trial)
        if candidate.key not in keys:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        if candidate.key in search.status:
            in_a_row += 1
            previous = search.status[candidate.key]
            if previous == "ok":
                study.tell(trial, search.measured[candidate.key])
            else:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        in_a_row = 0
        if not search.may_fit(candidate):
            search.status[candidate.key] = "pruned"
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        status, value = search.probe(candidate)
        if status == "ok":
            study.tell(trial, value)
        else:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)


def run_deepspeed_fast(table: Table, search: Search, max_probes: int, precision: str) -> None:
    """DeepSpeed's autotuner, "fast" tuner type, re-implemented on the table.

    As in deepspeed/autotuning/autotuner.py (``tune`` -> ``tune_space`` per stage): ZeRO
    stages in increasing order; for each stage the largest micro-batch its memory estimate
    admits (``get_max_train_micro_batch_size``; here the memory model at the limit), then
    ``num_tuning_micro_batch_sizes`` (3) micro-batches from that maximum down, halving; the
    stage's best is kept, and tuning stops when a stage is not at least 5% better than the
    best so far. It has no notion of offload, checkpointing or precision: it keeps the
    user's config (``precision``: fp32 is DeepSpeed's default, a config without a bf16 or
    fp16 section; the replay also runs it with each other precision of the table, as for a
    user who already knew; no offload, no checkpointing), and it does not search gradient
    accumulation beyond what the global batch implies.
    """
    base = {"offload_optimizer": "none", "offload_param": "none", "activation_checkpointing": False}
    best_so_far = 0.0
    for stage in (0, 1, 2, 3):
        options = sorted(
            (
                c
                for c in table.candidates
                if c.zero_stage == stage
                and c.precision == precision
                and all(getattr(c, k) == v for k, v in base.items())
                and not c.zero_knobs.items()
            ),
            key=lambda c: c.micro_batch_size,
        )
        fitting = [c for c in options if search.may_fit(c)]
        if not fitting:
            continue
        largest = fitting[-1].micro_batch_size
        tries, mbs = [], largest
        while len(tries) < 3 and mbs >= 1:
            tries += [c for c in fitting if c.micro_batch_size == mbs]
            mbs //= 2
        stage_best = 0.0
        for candidate in tries:
            if search.probes >= max_probes:
                return
            status, value = search.probe(candidate)
            stage_best = max(stage_best, value if status == "ok" else 0.0)
        if best_so_far and stage_best < best_so_far * 1.05:
            return
        best_so_far = max(best_so_far, stage_best)


def autotune_confirmed(table: Table, models: Models, seed: int, budget: int) -> float:
    """What a run with ``budget`` probes exports: autotune's search with the tuner's reserve
    held back (:func:`run_autotune` with ``confirming``), then the confirmation round with
    the probes left: contenders by :func:`autotune.study.confirmation.pick_contenders` (a probe's
    95%
    interval is ±1.96 x the table's noise), rounds by
    :func:`autotune.study.confirmation.run_rounds`,
    the tuner's own driver. Returns the table's (true) throughput of the exported
    candidate."""
    search = Search(table, models.may_fit, seed)
    run_autotune(table, search, budget, models, confirming=True)
    left = budget - search.probes
    ranked = sorted(search.measured, key=search.measured.get, reverse=True)
    if not ranked:
        return 0.0
    estimates = [(search.measured[k], 1.96 * table.noise * search.measured[k]) for k in ranked]
    keys = [ranked[i] for i in confirm.pick_contenders(estimates)]
    simpler_rule = RULE_IN_USE[0] in SIMPLER_RULES  # the earlier rules know no simplicity order
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(
                trial=i,
                label=k,
                samples_per_s=[search.measured[k]],
                moving_parts=list(table.candidate(k).moving_parts) if simpler_rule else [],
            )
            for i, k in enumerate(keys)
        ]
    )
    by_trial = {c.trial: c for c in verdict.contenders}

    def one_round(trials: list[int]) -> bool:
        nonlocal left
        if len(keys) < 2 or left < len(trials):
            return False
        for trial in trials:
            contender = by_trial[trial]
            status, value = table.probe(table.candidate(contender.label), search.rng)
            if status == "ok":
                contender.samples_per_s.append(value)
        left -= len(trials)
        return True

    confirm.run_rounds(verdict, one_round)
    winner = verdict.contenders[0].label
    assert table.feasible(winner)  # never an infeasible export
    return table.truth(winner)


# The confirmation round's rule: the tuner's (the lower of median and mean, the simpler and
# the steadier within noise), or earlier ones, to compare them on the same replays.
RULES = ("lower+simpler+steadier", "median+simpler+steadier", "median+steadier", "median", "mean")
RULE_IN_USE = ["lower+simpler+steadier"]
SIMPLER_RULES = ("lower+simpler+steadier", "median+simpler+steadier")


def use_rule(rule: str) -> None:
    """Make :mod:`autotune.study.confirmation` rank by ``rule`` (for comparisons only)."""
    RULE_IN_USE[0] = rule
    if rule == RULES[0]:
        return  # the tuner's own
    summarize = confirm.Contender.summarize
    by = statistics.fmean if rule == "mean" else statistics.median

    def estimate_by(contender: confirm.Contender) -> None:
        summarize(contender)
        values = contender.samples_per_s
        if values:
            contender.estimate = by(values)
        if len(values) >= 2 and contender.spread:  # relative to the median, as these rules had it
            contender.spread = statistics.stdev(values) / statistics.median(values)

    confirm.Contender.summarize = estimate_by  # type: ignore[method-assign]
    if rule in ("median", "mean"):
        confirm.MIN_SPREAD = math.inf  # nobody is steadier: the highest estimate wins
