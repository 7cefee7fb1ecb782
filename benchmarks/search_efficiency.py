"""How close does each search strategy get to the best configuration, in how many probes?

(a) Exhaustive tables: every valid candidate of a space probed on real hardware with
    ``--sampler grid``, then dumped to ``benchmarks/data/table_<name>.json``::

        autotune run --workload gpt-tiny --gpus 2 --space benchmarks/spaces/cpu_table.yaml \\
            --sampler grid --no-prune --max-timed-steps 10 --executor local --budget 45m \\
            --storage sqlite:////tmp/tables/tables.db --study table-gpt-tiny
        python benchmarks/search_efficiency.py dump --storage sqlite:////tmp/tables/tables.db \\
            --study table-gpt-tiny --out benchmarks/data/table_gpt-tiny.json

    The same grid measured several times (``--study A --study B ...``) gives a table of
    medians. ``dump`` also records this CPU's matmul rate per precision (the cost model's
    compute prior, as a run measures it), so dump on the machine that measured the table.

(b) Replays: each strategy searches the table many times (different seeds, and a 3%
    Gaussian noise on every looked-up throughput, about what a short probe measures here),
    under a memory limit applied to the measured peaks. For budgets of 5, 10 and 20 probes
    it reports best-found / best-possible (median and worst over the repeats) and the
    probes needed to get within 2% of the best::

        python benchmarks/search_efficiency.py replay --table benchmarks/data/table_gpt-tiny.json \\
            --limit 1.5GiB --repeats 30

Strategies: autotune's sampler (memory model + calibrated cost model, see
autotune/sampler.py), both as the best it believes after N probes and as what a run of N
probes exports after its confirmation round ("autotune, confirmed": the round is reserved
from the N probes as the tuner plans it), Optuna's TPE and random samplers (the tuner's
memory screen and de-duplication apply to them as in a real run), and a re-implementation
of DeepSpeed's autotuner "fast" strategy (deepspeed/autotuning/autotuner.py, documented
below), run once per precision of the table since DeepSpeed keeps the user's. A proposal
the memory model rules out costs no probe, as in a real run.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune import confirm, records  # noqa: E402
from autotune.budget import ReservePolicy  # noqa: E402
from autotune.candidate import Candidate  # noqa: E402

BUDGETS = (5, 10, 20)
NOISE = 0.03
WITHIN = 0.02


# -- tables ----------------------------------------------------------------------------
def relative(ref: str) -> str:
    """A file path (or ``path.py:function``) under the repository, made relative to it, so
    that a table does not hold the path of the machine that measured it."""
    path = Path(ref.split(":")[0])
    if path.is_absolute() and path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT)) + ref[len(str(path)) :]
    return ref


def absolute(ref: str) -> str:
    """The inverse of :func:`relative`, for a table's references."""
    head, sep, tail = ref.partition(":")
    path = ROOT / head
    return f"{path}{sep}{tail}" if (sep or "/" in head) and path.exists() else ref


def dump(storage: str, study_names: list[str], out: Path) -> None:
    """Write the grid studies' table; with several studies of the same grid (repeated
    measurements), each candidate's throughput is the median of its runs and its peak the
    largest, so the replay's truth carries less of one probe's noise."""
    import optuna

    runs: dict[str, list[dict]] = {}
    config = flags = None
    for study_name in study_names:
        study = optuna.load_study(study_name=study_name, storage=storage)
        study_config = study.user_attrs["autotune_config"]
        if config is not None and study_config != config:
            raise SystemExit(f"study {study_name!r} was measured with other settings")
        config = study_config
        flags = study.user_attrs.get("autotune_flags", {})
        for trial in records.views(study):
            if not trial.is_evaluation or trial.status in ("interrupted", "running"):
                continue  # a repeat, or interrupted: its retry is the measurement
            runs.setdefault(trial.label, []).append(
                {**trial.record.model_dump(mode="json"), "status": trial.status}
            )
    assert config is not None and flags is not None
    rows = []
    for label, measured in runs.items():
        ok = [a for a in measured if a.get("status") == "ok"]
        if len(ok) * 2 < len(measured):  # mostly failed: the failure is the measurement
            first = measured[0]
            status, rate = first.get("status"), 0.0
        else:
            status, rate = "ok", statistics.median(a["samples_per_s"] for a in ok)
        rows.append(
            {
                "candidate": measured[0]["candidate"],
                "label": label,
                "status": status,
                "samples_per_s": rate,
                "samples_per_s_runs": [a.get("samples_per_s", 0.0) for a in measured],
                "step_times_s": [t for a in measured for t in a.get("step_times_s", [])],
                "peak_bytes": max(a.get("peak_bytes", 0) for a in measured),
                "probe_wall_s": statistics.fmean(a.get("probe_wall_s", 0.0) for a in measured),
            }
        )
    table = {
        "study": study_names[0] if len(study_names) == 1 else study_names,
        "workload": relative(config["workload"]),
        "ranks": config["gpus_per_trial"],
        "global_batch": config["global_batch"],
        "accelerator": config["accelerator"],
        "threads_per_rank": config["threads_per_rank"],
        "space": relative(flags.get("space") or "default"),
        "rows": rows,
    }
    if config["accelerator"] == "cpu":
        # The cost model's compute prior per precision comes from this CPU's matmul rates
        # (a run measures them at its start; a grid run does not need them). Dump on the
        # machine that measured the table, so its replays see the same CPU.
        from autotune.cost import measure_cpu_matmul_flops

        precisions = tuple(sorted({r["candidate"]["precision"] for r in rows} | {"fp32"}))
        table["cpu_matmul_flops"] = measure_cpu_matmul_flops(precisions, config["threads_per_rank"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    ok = [r for r in rows if r["status"] == "ok"]
    print(f"{out}: {len(rows)} candidates, {len(ok)} measured ok")


@dataclass(frozen=True)
class Bimodal:
    """Offload candidates' probes in two modes, as CPU-offload configs measured here (the
    DeepSpeed comparison's harness: 150..214 samples/s for one config): the table's value
    is the fast mode, and ``share`` of the probes land ``slow`` below it. What production
    gets over many runs, the truth a pick is scored by, is the mix of both modes."""

    share: float = 0.5
    slow: float = 0.3

    def truth(self, fast_mode: float) -> float:
        return fast_mode * (1.0 - self.share * self.slow)


@dataclass
class Table:
    rows: dict[str, dict]
    candidates: list[Candidate]
    limit_bytes: int
    meta: dict
    noise: float = NOISE
    bimodal: Bimodal | None = None

    @classmethod
    def load(
        cls, path: Path, limit_bytes: int, noise: float = NOISE, bimodal: Bimodal | None = None
    ) -> Table:
        data = json.loads(path.read_text())
        rows, candidates = {}, []
        for row in data["rows"]:
            candidate = Candidate.model_validate(row["candidate"])
            rows[candidate.key] = row
            candidates.append(candidate)
        return cls(rows, candidates, limit_bytes, data, noise, bimodal)

    def candidate(self, key: str) -> Candidate:
        return Candidate.model_validate(self.rows[key]["candidate"])

    def feasible(self, key: str) -> bool:
        row = self.rows[key]
        return row["status"] == "ok" and 0 < row["peak_bytes"] <= self.limit_bytes

    def truth(self, key: str) -> float:
        """The samples/s a pick of ``key`` gets in production (see :class:`Bimodal`)."""
        value = self.rows[key]["samples_per_s"]
        candidate = self.candidate(key)
        offload = candidate.offload_optimizer != "none" or candidate.offload_param != "none"
        return self.bimodal.truth(value) if self.bimodal and offload else value

    def best_possible(self) -> float:
        return max(self.truth(k) for k in self.rows if self.feasible(k))

    def probe(self, candidate: Candidate, rng: random.Random) -> tuple[str, float]:
        """(status, samples/s) as a probe would measure it: noisy, limit applied; with the
        bimodal model, a share of an offload candidate's probes land in a slower mode."""
        row = self.rows[candidate.key]
        if row["status"] != "ok":
            return row["status"], 0.0
        if row["peak_bytes"] > self.limit_bytes:
            return "oom", 0.0
        value = row["samples_per_s"] * max(0.5, rng.gauss(1.0, self.noise))
        offload = candidate.offload_optimizer != "none" or candidate.offload_param != "none"
        if self.bimodal is not None and offload and rng.random() < self.bimodal.share:
            value *= 1.0 - self.bimodal.slow
        return "ok", value


@dataclass
class Trajectory:
    """Best true throughput found after each probe (the table's value of the candidate the
    strategy believes best: what an export would hand to production)."""

    believed: list[float] = field(default_factory=list)

    def at(self, budget: int) -> float:
        if not self.believed:
            return 0.0
        return self.believed[min(budget, len(self.believed)) - 1]


class Search:
    """Bookkeeping shared by strategies: probes, de-duplication, the memory screen."""

    def __init__(self, table: Table, may_fit: Callable[[Candidate], bool], seed: int) -> None:
        self.table = table
        self.may_fit = may_fit
        self.rng = random.Random(seed)
        self.measured: dict[str, float] = {}  # key -> measured samples/s (noisy)
        self.status: dict[str, str] = {}
        self.trajectory = Trajectory()

    def probe(self, candidate: Candidate) -> tuple[str, float]:
        status, value = self.table.probe(candidate, self.rng)
        self.status[candidate.key] = status
        if status == "ok":
            self.measured[candidate.key] = value
        believed_best = max(self.measured, key=self.measured.get, default=None)
        true = self.table.truth(believed_best) if believed_best else 0.0
        assert believed_best is None or self.table.feasible(believed_best)  # never infeasible
        self.trajectory.believed.append(true)
        return status, value

    @property
    def probes(self) -> int:
        return len(self.trajectory.believed)


# -- strategies --------------------------------------------------------------------------
def run_autotune(
    table: Table, search: Search, max_probes: int, models: Models, *, confirming: bool = False
) -> None:
    """autotune's search for ``max_probes``; ``confirming``: less the confirmation round's
    reserve, held back by the tuner's own :class:`~autotune.budget.ReservePolicy` (counted
    in probes: every probe takes one unit of the budget)."""
    from autotune.sampler import CandidatePolicy, History

    policy = CandidatePolicy(
        table.candidates, cost=models.cost(), may_fit=search.may_fit, mode="model"
    )
    reserve = ReservePolicy(enabled=confirming)
    history = History()
    while True:
        estimates = sorted(
            ((v, 1.96 * table.noise * v) for v in search.measured.values()), reverse=True
        )
        held = reserve.reserve_s(
            feasible=len(search.measured),
            stages_covered=policy.covered(history),
            contenders=len(confirm.pick_contenders(estimates)),
            full_probe_s=1.0,
            probe_s=1.0,
            budget_s=float(max_probes),
        )
        if search.probes >= max_probes - math.floor(held):
            break
        pick = policy.choose(history)
        if pick is None:
            break
        status, value = search.probe(pick)
        step_s = pick.train_batch_size / value if value else None
        history.add(pick, status, step_s)


def run_optuna(table: Table, search: Search, max_probes: int, sampler_name: str) -> None:
    import optuna

    from autotune.space import SpaceSpec

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
    del SpaceSpec


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
    the probes left: contenders by :func:`autotune.confirm.pick_contenders` (a probe's 95%
    interval is ±1.96 x the table's noise), rounds by :func:`autotune.confirm.run_rounds`,
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
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=i, label=k, samples_per_s=[search.measured[k]])
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


# The confirmation round's rule: the tuner's (median, and the steadier within noise), or
# earlier ones, to compare them on the same replays.
RULES = ("median+steadier", "median", "mean")
RULE_IN_USE = ["median+steadier"]


def use_rule(rule: str) -> None:
    """Make :mod:`autotune.confirm` rank by ``rule`` (for comparisons only)."""
    RULE_IN_USE[0] = rule
    if rule == "median+steadier":
        return
    confirm.MIN_SPREAD = math.inf  # nobody is steadier: the highest estimate wins
    if rule == "mean":
        summarize = confirm.Contender.summarize

        def by_mean(contender: confirm.Contender) -> None:
            summarize(contender)
            if contender.samples_per_s:
                contender.estimate = statistics.fmean(contender.samples_per_s)

        confirm.Contender.summarize = by_mean  # type: ignore[method-assign]


# -- models used offline ----------------------------------------------------------------
class Models:
    """The memory model at the table's limit and the cost model, for the table's workload."""

    def __init__(self, table: Table, margin: float = 0.05) -> None:
        from autotune.memory import MemoryModel
        from autotune.workloads import get_workload

        self.table = table
        self.workload = get_workload(absolute(table.meta["workload"]))
        self.memory = MemoryModel(self.workload)
        self.threshold = table.limit_bytes * (1 - margin)
        self._fits: dict[str, bool] = {}

    def may_fit(self, candidate: Candidate) -> bool:
        if candidate.key not in self._fits:
            estimate = self.memory.predict(candidate)
            self._fits[candidate.key] = (
                estimate.tracked_bytes(self.table.meta["accelerator"]) <= self.threshold
            )
        return self._fits[candidate.key]

    def cost(self):
        from autotune.cost import CostModel, WorkloadFacts, compute_scale_from
        from autotune.memory import model_facts

        facts = WorkloadFacts(model_facts(self.workload, 0).params, self.workload.tokens_per_sample)
        # Tables measured before the dump recorded the CPU's rates replay on nominal priors.
        scale = compute_scale_from(self.table.meta.get("cpu_matmul_flops", {}))
        return CostModel(
            facts,
            self.table.meta["accelerator"],
            threads=self.table.meta["threads_per_rank"],
            compute_scale=scale,
        )


def table_space(table: Table):
    """A bound space whose candidates are the table's (for Optuna's samplers)."""
    from autotune.hardware import detect
    from autotune.space import load_space

    spec = load_space(absolute(table.meta["space"]))
    hardware = detect()
    return spec.bind(
        hardware,
        data_parallel_size=table.meta["ranks"],
        global_batch=table.meta["global_batch"],
        max_global_batch=None,
        nvme_path=None,
        nvme_unavailable=None,
        partial_offload_supported=True,
    )


def replay(
    path: Path,
    limit_bytes: int,
    repeats: int,
    max_probes: int,
    out: Path | None,
    noise: float = NOISE,
    bimodal: Bimodal | None = None,
) -> dict:
    table = Table.load(path, limit_bytes, noise, bimodal)
    models = Models(table)
    best = table.best_possible()
    feasible = sum(table.feasible(k) for k in table.rows)
    strategies: dict[str, Callable[[Search], None]] = {
        "autotune": lambda s: run_autotune(table, s, max_probes, models),
        "optuna-tpe": lambda s: run_optuna(table, s, max_probes, "tpe"),
        "random": lambda s: run_optuna(table, s, max_probes, "random"),
    }
    precisions = sorted({c.precision for c in table.candidates}, key=lambda p: p != "fp32")
    for precision in precisions:  # fp32 first: DeepSpeed's default when the config says none
        strategies[f"deepspeed-fast ({precision})"] = lambda s, precision=precision: (
            run_deepspeed_fast(table, s, max_probes, precision)
        )
    results: dict[str, dict] = {}
    for name, strategy in strategies.items():
        fractions: dict[int, list[float]] = {b: [] for b in BUDGETS}
        needed: list[int | None] = []
        probes_used: list[int] = []
        for seed in range(repeats):
            search = Search(table, models.may_fit, seed)
            strategy(search)
            probes_used.append(search.probes)
            for budget in BUDGETS:
                fractions[budget].append(search.trajectory.at(budget) / best)
            within = [
                i + 1 for i, v in enumerate(search.trajectory.believed) if v >= best * (1 - WITHIN)
            ]
            needed.append(within[0] if within else None)
        reached = [n for n in needed if n is not None]
        results[name] = {
            "median": {b: statistics.median(fractions[b]) for b in BUDGETS},
            "worst": {b: min(fractions[b]) for b in BUDGETS},
            "mean": {b: statistics.fmean(fractions[b]) for b in BUDGETS},
            "probes_to_within_2pct_median": statistics.median(reached)
            if len(reached) > repeats // 2
            else None,
            "reached_within_2pct": f"{len(reached)}/{repeats}",
            "probes_used_median": statistics.median(probes_used),
        }
        if name == "autotune":
            # The export of a run of each budget: search and confirmation within it.
            confirmed = {
                b: [autotune_confirmed(table, models, seed, b) / best for seed in range(repeats)]
                for b in BUDGETS
            }
            results["autotune, confirmed"] = {
                "median": {b: statistics.median(confirmed[b]) for b in BUDGETS},
                "worst": {b: min(confirmed[b]) for b in BUDGETS},
                "mean": {b: statistics.fmean(confirmed[b]) for b in BUDGETS},
                "probes_to_within_2pct_median": None,
                "reached_within_2pct": "-",
                "probes_used_median": None,
            }
    report = {
        "table": str(path.resolve().relative_to(ROOT))
        if path.resolve().is_relative_to(ROOT)
        else str(path),
        "limit_bytes": limit_bytes,
        "candidates": len(table.rows),
        "feasible": feasible,
        "best_samples_per_s": best,
        "best_label": next(
            table.rows[k]["label"]
            for k in table.rows
            if table.feasible(k) and table.truth(k) == best
        ),
        "repeats": repeats,
        "noise": noise,
        "bimodal": None if bimodal is None else {"share": bimodal.share, "slow": bimodal.slow},
        "confirmation_rule": RULE_IN_USE[0],
        "results": results,
    }
    print_report(report)
    if out:
        out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def print_report(report: dict) -> None:
    from autotune.settings import format_bytes

    print(
        f"{report['table']}: {report['candidates']} candidates, {report['feasible']} feasible "
        f"under {format_bytes(report['limit_bytes'])}; best {report['best_label']} "
        f"{report['best_samples_per_s']:.1f} samples/s; {report['repeats']} repeats, "
        f"{100 * report['noise']:.1f}% probe noise"
        + (" (bimodal offload probes)" if report.get("bimodal") else "")
    )
    header = "| strategy | " + " | ".join(f"{b} probes: median / mean (worst)" for b in BUDGETS)
    print(header + " | probes to within 2% (median; runs that got there) |")
    print("|" + " --- |" * (len(BUDGETS) + 2))
    for name, r in report["results"].items():
        cells = [
            f"{r['median'][b]:.3f} / {r['mean'][b]:.3f} ({r['worst'][b]:.3f})" for b in BUDGETS
        ]
        needed = r["probes_to_within_2pct_median"]
        needed_text = f"{needed:g}" if needed is not None else "-"
        reached = r["reached_within_2pct"]
        print(f"| {name} | " + " | ".join(cells) + f" | {needed_text} ({reached}) |")


def main(argv: list[str] | None = None) -> int:
    from autotune.settings import parse_size

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="write a grid study's table as JSON")
    d.add_argument("--storage", required=True)
    d.add_argument(
        "--study",
        required=True,
        action="append",
        help="a grid study; repeat for repeated measurements of the same grid (median)",
    )
    d.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("replay", help="replay strategies against a table")
    r.add_argument("--table", type=Path, required=True)
    r.add_argument("--limit", default="64GiB", help="memory limit per rank applied to the peaks")
    r.add_argument("--repeats", type=int, default=30)
    r.add_argument("--max-probes", type=int, default=40)
    r.add_argument("--out", type=Path)
    r.add_argument(
        "--noise",
        type=float,
        default=NOISE,
        help="relative standard deviation of one probe (default 0.03; the AMX table's "
        "three grid runs measured 0.075)",
    )
    r.add_argument(
        "--confirmation-rule",
        choices=list(RULES),
        default="median+steadier",
        help="how the confirmation round ranks its contenders: the tuner's rule (default), "
        "or an earlier one for comparison",
    )
    r.add_argument(
        "--bimodal",
        action="store_true",
        # argparse formats help with %: the percent signs are doubled
        help=f"offload candidates' probes in two modes: {100 * Bimodal.share:.0f}%% of them "
        f"{100 * Bimodal.slow:.0f}%% below the table's value, as CPU offload measured here",
    )
    args = parser.parse_args(argv)
    if args.command == "replay":
        use_rule(args.confirmation_rule)
    if args.command == "dump":
        dump(args.storage, args.study, args.out)
    else:
        replay(
            args.table,
            parse_size(args.limit, flag="--limit"),
            args.repeats,
            args.max_probes,
            args.out,
            args.noise,
            Bimodal() if args.bimodal else None,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
