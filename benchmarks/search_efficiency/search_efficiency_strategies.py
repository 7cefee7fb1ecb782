"""The search strategies a replay compares, each run against a measured table.

autotune's sampler (both as the best it believes and as what a run exports after its
confirmation round), Optuna's TPE and random samplers under the tuner's rules, and a
re-implementation of DeepSpeed's autotuner "fast" strategy; plus the confirmation rule the
replay ranks contenders by.
"""

from __future__ import annotations

import math
import random
import statistics

from autotune.candidate import Candidate
from autotune.run import ReservePolicy, SearchState
from autotune.run.budget import DEFAULT_FINISH_S, BudgetClock, BudgetRecord
from autotune.study import confirmation as confirm
from benchmarks.search_efficiency.search_efficiency_table import Models, Search, Table, table_space


class ReplayTime:
    """A replayed run's time, on the tuner's own :class:`~autotune.run.budget.BudgetClock`
    (the clock advanced by each probe's wall time). Counted (``timed`` False): every probe
    takes one second and nothing is held for the run's finish, so a budget of N seconds is
    one of N probes. Timed: each probe takes its table row's ``probe_wall_s`` times the
    table's noise (a run's probes of one config differ as its throughputs do), and the
    tuner's default finish is held back, as a run's first does."""

    def __init__(
        self, budget_s: float, *, timed: bool = False, seed: int = 0, scale: float = 1.0
    ) -> None:
        self.timed = timed
        self.scale = scale  # probes this many times as long as the table's
        self.now_s = 0.0
        self.walls_s: list[float] = []
        self.last_s: dict[str, float] = {}  # each candidate's latest probe time
        self._rng = random.Random(10_000 + seed)  # apart from the search's own draws
        record = BudgetRecord(total_s=budget_s, finish_s=DEFAULT_FINISH_S if timed else 0.0)
        self.clock = BudgetClock(record, None, clock=lambda: self.now_s)
        self.clock.start()

    def wall_s(self, table: Table, candidate: Candidate) -> float:
        """What one probe of ``candidate`` takes."""
        if not self.timed:
            return 1.0
        row_s = table.rows[candidate.key].get("probe_wall_s") or 1.0
        return self.scale * row_s * max(0.5, self._rng.gauss(1.0, table.noise))

    def probe(self, table: Table, candidate: Candidate) -> None:
        """Spend one probe of ``candidate``."""
        seconds = self.wall_s(table, candidate)
        self.now_s += seconds
        self.walls_s.append(seconds)
        self.last_s[candidate.key] = seconds

    @property
    def estimate_s(self) -> float:
        """The next probe's estimate, as the tuner's :func:`~autotune.run.budget.probe_estimate_s`
        (the median of the probes so far)."""
        if not self.timed:
            return 1.0
        return statistics.median(self.walls_s) if self.walls_s else 0.0

    def fits(self, held_s: float) -> bool:
        """The tuner's stop rule (``Search._stop_reason``): what is left for probes, less
        ``held_s``, still holds the next probe's estimate."""
        free_s = self.clock.probing_left_s - held_s
        return free_s > 0 and free_s >= (self.estimate_s if self.walls_s else 0.0)


def run_autotune(
    table: Table,
    search: Search,
    max_probes: int,
    models: Models,
    *,
    confirming: bool = False,
    time: ReplayTime | None = None,
) -> None:
    """autotune's search for ``max_probes``; ``confirming``: less the confirmation round's
    reserve, held back by the tuner's own :class:`~autotune.run.budget.ReservePolicy`, on
    ``time`` (:class:`ReplayTime`; by default counted in probes: every probe takes one unit
    of the budget)."""
    from autotune.run import CandidatePolicy, History

    time = time or ReplayTime(float(max_probes))
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
            full_probe_s=time.estimate_s,
            probe_s=time.estimate_s,
            budget_s=time.clock.run_budget_s,
        )
        if not time.fits(reserve.reserve_s(state)):
            break
        best = max(search.measured.values(), default=0.0)
        if reserve.settled(state, promising=policy.promising(history, (0, best))):
            break  # nothing promising left on a budget short of the round's plan
        pick = policy.choose(history)
        if pick is None:
            break
        status, value = search.probe(pick)
        time.probe(table, pick)
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


def autotune_confirmed(
    table: Table,
    models: Models,
    seed: int,
    budget: int,
    *,
    budget_s: float | None = None,
    probe_scale: float = 1.0,
) -> float:
    """What a run with ``budget`` probes (or, ``budget_s``, seconds of the table's own probe
    times, :class:`ReplayTime`) exports: autotune's search with the tuner's reserve held back
    (:func:`run_autotune` with ``confirming``), then the confirmation round with the time
    left: contenders by :func:`autotune.study.confirmation.pick_contenders` (a probe's 95%
    interval is ±1.96 x the table's noise), rounds by
    :func:`autotune.study.confirmation.run_rounds`, the tuner's own driver, a round only
    where the time left holds each contender's own probe time (as
    ``autotune.run._confirmation_rounds``). Returns the table's (true) throughput of the
    exported candidate."""
    search = Search(table, models.may_fit, seed)
    timed = budget_s is not None
    time = ReplayTime(
        budget_s if timed else float(budget), timed=timed, seed=seed, scale=probe_scale
    )
    run_autotune(table, search, budget, models, confirming=True, time=time)
    run = {"search_probes": search.probes, "search_s": time.now_s}
    TIMED_RUNS.append(run)
    if not search.measured:
        return 0.0
    verdict = _contenders(table, search)
    keys = [c.label for c in verdict.contenders]
    by_trial = {c.trial: c for c in verdict.contenders}

    def one_round(trials: list[int]) -> bool:
        labels = [by_trial[trial].label for trial in trials]
        needed_s = sum(max(time.last_s[k], 1.0) if timed else 1.0 for k in labels)
        if len(keys) < 2 or time.clock.probing_left_s < needed_s:
            return False
        for trial in trials:
            contender = by_trial[trial]
            candidate = table.candidate(contender.label)
            status, value = table.probe(candidate, search.rng)
            time.probe(table, candidate)
            if status == "ok":
                contender.samples_per_s.append(value)
        return True

    confirm.run_rounds(verdict, one_round)
    run["total_s"] = time.now_s
    winner = verdict.contenders[0].label
    assert table.feasible(winner)  # never an infeasible export
    return table.truth(winner)


def _contenders(table: Table, search: Search) -> confirm.Confirmation:
    """The round's contenders among the search's measurements, undecided."""
    ranked = sorted(search.measured, key=search.measured.get, reverse=True)
    estimates = [(search.measured[k], 1.96 * table.noise * search.measured[k]) for k in ranked]
    keys = [ranked[i] for i in confirm.pick_contenders(estimates)]
    simpler_rule = RULE_IN_USE[0] in SIMPLER_RULES  # the earlier rules know no simplicity order
    return confirm.Confirmation(
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


# Each timed replay's search: its probes and seconds (read by the replay's report).
TIMED_RUNS: list[dict] = []

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
