"""The measured table a search-efficiency replay runs on, and the bookkeeping of one search.

A table (``benchmarks/search_efficiency/data/table_<name>.json``, written by
``search_efficiency.py dump``) holds every candidate of a grid study with its measured
throughput and peak; :class:`Table` looks a candidate up as a probe would measure it (noise,
the memory limit, optionally two modes for offload), :class:`Search` keeps what one strategy
has probed, and :class:`Models` binds autotune's memory and cost models to the table's
workload.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from autotune.candidate import Candidate

ROOT = Path(__file__).resolve().parents[2]
NOISE = 0.03


def pass_noise(path: Path) -> float:
    """The table's own probe noise: per candidate measured ``ok`` in every grid run, the
    standard deviation of its runs over their mean; the median over candidates (rounded
    to 0.1%, so that a replay's arguments say it). A table of one run has none."""
    import statistics

    rows = json.loads(path.read_text())["rows"]
    spreads = [
        statistics.stdev(runs) / statistics.fmean(runs)
        for runs in (row.get("samples_per_s_runs", []) for row in rows)
        if len(runs) >= 2 and min(runs) > 0
    ]
    if not spreads:
        raise SystemExit(f"{path}: --noise measured needs a table of two or more grid runs")
    return round(statistics.median(spreads), 3)


def probe_scale(table: Table, probe_s: float | None) -> float:
    """The factor on the table's probe times that makes their median ``probe_s`` (1 without
    it): a slower machine or model, the same table's ranking."""
    if not probe_s:
        return 1.0
    walls_s = [row["probe_wall_s"] for row in table.rows.values() if row.get("probe_wall_s")]
    return probe_s / statistics.median(walls_s)


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


class Models:
    """The memory model at the table's limit and the cost model, for the table's workload."""

    def __init__(self, table: Table, margin: float = 0.05) -> None:
        from autotune.memory import MemoryModel
        from autotune.workloads import get_workload

        self.table = table
        self.threshold = table.limit_bytes * (1 - margin)
        self._fits: dict[str, bool] = {}
        self.script_params: int | None = table.meta.get("script_params")
        if self.script_params is not None:
            # A script's memory model is learned from a run's own probes, which a replay
            # does not have: a script table replays where every candidate fits.
            largest = max(row.get("peak_bytes", 0) for row in table.rows.values())
            if largest > self.threshold:
                raise SystemExit(
                    f"{table.meta['workload']}: a script table replays without a memory limit "
                    f"(its largest peak is {largest} bytes); drop --limit"
                )
            return
        self.workload = get_workload(absolute(table.meta["workload"]))
        self.memory = MemoryModel(self.workload)

    def may_fit(self, candidate: Candidate) -> bool:
        if self.script_params is not None:
            return True
        if candidate.key not in self._fits:
            estimate = self.memory.predict(candidate)
            self._fits[candidate.key] = (
                estimate.tracked_bytes(self.table.meta["accelerator"]) <= self.threshold
            )
        return self._fits[candidate.key]

    def cost(self):
        from autotune.memory import model_facts
        from autotune.run import CostModel, WorkloadFacts, compute_scale_from

        if self.script_params is not None:  # a script's rates are in samples, not tokens
            facts = WorkloadFacts(params=self.script_params, tokens_per_sample=1)
        else:
            facts = WorkloadFacts(
                model_facts(self.workload, 0).params, self.workload.tokens_per_sample
            )
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
