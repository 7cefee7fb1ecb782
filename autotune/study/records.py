"""Typed trial records: the only code that reads or writes a trial's user attrs.

A trial's record (:class:`TrialRecord`) is stored as one Optuna user attr per field, so that
optuna-dashboard shows each as a column, plus :data:`SCHEMA_ATTR`, the version of this
layout. :class:`TrialView` pairs a record with what Optuna itself knows of the trial (number,
state, value) and answers the questions the rest of autotune asks: is this an evaluation of
its own, was it measured in full, is it feasible.

Recording an outcome (record fields, the memory constraint, Optuna's tell) happens here
too, so a trial's state and its record never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field

from autotune.candidate import Candidate
from autotune.measurement import (
    DevicePeaks,
    HostPeaks,
    LogTail,
    Throughput,
    Versions,
    copy_parts,
)
from autotune.protocol import HOST_PEAK_WORDS, ProbeResult

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from autotune.training_goal import TrainingGoal


# 5: the probe's config stored as backend_config (ds_config before: read as the same field);
# 4: measured host memory judged (host_peak_method, node_per_rank, host_ram_bytes); 3: readable
# memory fields (memory, peak_pct_of_limit). Records of 2 and 3 read the same (defaults).
SCHEMA_VERSION = 5
SCHEMA_ATTR = "autotune_schema"

TrialStatus = Literal[
    "running", "ok", "oom", "error", "timeout", "pruned", "interrupted", "duplicate"
]
# Statuses of a probe that ran (or a candidate judged without one).
MEASURED_STATUSES = ("ok", "oom")
FAILED_STATUSES = ("error", "timeout", "interrupted")


class TrialRecord(Throughput, DevicePeaks, HostPeaks, Versions, LogTail):
    """What autotune knows of one trial, beyond Optuna's state and value."""

    model_config = ConfigDict(extra="forbid")

    candidate: Candidate | None = Field(default=None, description="The candidate evaluated.")
    candidate_key: str = Field(default="", description="Canonical identity of the candidate.")
    label: str = Field(default="", description="Short label, e.g. 'z2 bf16 mb8x2 opt:cpu'.")
    status: TrialStatus = Field(default="running", description="How the evaluation ended.")
    error: str = Field(default="", description="Why it failed or was judged infeasible.")
    backend_config: dict[str, Any] | None = Field(
        default=None, description="The backend's config the probe ran with."
    )
    trial_dir: str = Field(default="", description="Folder of the probe's spec, reports, log.")
    peak_bytes: int = Field(default=0, description="Worst rank's peak (allocated or reserved).")
    overhead_bytes: int = Field(
        default=0,
        description="CUDA memory outside the caching allocator (context, NCCL, cuBLAS), the "
        "largest rank's; included in reserved_bytes_per_rank.",
    )
    vram_limit_bytes: int = Field(default=0, description="The limit it was judged against.")
    host_ram_bytes: int = Field(
        default=0,
        description="The host RAM per node (--host-ram) its measured host memory was judged "
        "against; 0: not judged (records written before host memory was).",
    )
    feasible: bool = Field(default=False, description="Measured and within the limit.")
    predicted_peak_bytes: int | None = Field(
        default=None, description="The memory model's calibrated prediction per rank."
    )
    predicted_raw_bytes: int | None = Field(
        default=None, description="The prediction before calibration (what calibration uses)."
    )
    predicted_host_bytes: int | None = Field(
        default=None, description="Predicted host memory per rank."
    )
    predicted_phase: str = Field(default="", description="Phase of the predicted peak.")
    memory_correction: float | None = Field(
        default=None, description="Calibration factor applied to the prediction."
    )
    probe_wall_s: float | None = Field(default=None, description="Launch to result.")
    probe_init_s: float = Field(default=0.0, description="Imports to end of initialize.")
    probe_timed_s: float = Field(default=0.0, description="Time inside the timed steps.")
    probe_cold_start: bool = Field(
        default=False, description="Its wall time includes starting the process group."
    )
    pruned_by: str = Field(default="", description="What judged it infeasible without a probe.")
    oom_trial: int | None = Field(
        default=None, description="The trial whose OOM ruled this micro-batch out."
    )
    duplicate_of: int | None = Field(
        default=None, description="A repeated proposal: the trial that evaluated it."
    )
    retry_of: int | None = Field(
        default=None, description="A second probe of a candidate an interruption stopped."
    )
    confirmation_of: int | None = Field(
        default=None,
        description="Schema 1 only: a confirmation re-probe stored as a trial (newer studies "
        "keep re-probes in the confirmation verdict).",
    )
    # Derived when written (:func:`readable`), for people reading optuna-dashboard's table.
    memory: str = Field(
        default="",
        description="Readable: measured peak per rank against the limit, and the prediction.",
    )
    peak_pct_of_limit: float | None = Field(
        default=None, description="Measured peak per rank, % of the limit (a sortable column)."
    )

    @property
    def over_host_ram(self) -> bool:
        """A node's ranks together measured above the --host-ram it was judged against."""
        per_node = self.host_peak_per_node()
        return self.host_ram_bytes > 0 and max(per_node.values(), default=0) > self.host_ram_bytes


_FIELDS = tuple(TrialRecord.model_fields)
_DEFAULTS = TrialRecord().model_dump(mode="json")


def write(trial: optuna.Trial, record: TrialRecord) -> None:
    """Store ``record`` on a live trial: each field that differs from what the trial holds
    (a field at its default is not stored, unless the trial holds another value)."""
    record = readable(record)
    stored = trial.user_attrs
    if stored.get(SCHEMA_ATTR) != SCHEMA_VERSION:
        trial.set_user_attr(SCHEMA_ATTR, SCHEMA_VERSION)
    for key, value in record.model_dump(mode="json").items():
        if stored.get(key, _DEFAULTS[key]) != value:
            trial.set_user_attr(key, value)


def readable(record: TrialRecord) -> TrialRecord:
    """``record`` with its derived fields filled: memory in words next to the raw bytes."""
    from autotune.units import format_bytes

    limit = record.vram_limit_bytes
    parts = []
    measured = record.peak_bytes > 0 and record.status in MEASURED_STATUSES
    if measured:
        of = f" ({100 * record.peak_bytes / limit:.0f}% of {format_bytes(limit)})" if limit else ""
        parts.append(f"peak {format_bytes(record.peak_bytes)} per rank{of}")
    if record.predicted_peak_bytes is not None:
        parts.append(f"predicted {format_bytes(record.predicted_peak_bytes)}")
        if not measured and limit:
            parts[-1] += f" ({100 * record.predicted_peak_bytes / limit:.0f}% of the limit)"
    pct = round(100 * record.peak_bytes / limit, 1) if measured and limit else None
    return record.model_copy(update={"memory": "; ".join(parts), "peak_pct_of_limit": pct})


# Keys records of earlier schema versions stored a field under: the field's name now.
_RENAMED = {"ds_config": "backend_config"}  # before version 5


def read(attrs: dict[str, Any]) -> TrialRecord:
    """The record in a trial's user attrs (keys it does not know are ignored; a key an
    earlier version stored a field under reads as that field)."""
    values = {_RENAMED.get(k, k): v for k, v in attrs.items() if _RENAMED.get(k, k) in _FIELDS}
    return TrialRecord.model_validate(values)


@dataclass(frozen=True)
class TrialView:
    """A trial as autotune sees it: Optuna's number, state and value with the record."""

    number: int
    state: str  # Optuna's TrialState name: COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    value: float | None
    record: TrialRecord
    frozen: FrozenTrial

    @classmethod
    def of(cls, trial: FrozenTrial) -> TrialView:
        return cls(trial.number, trial.state.name, trial.value, read(trial.user_attrs), trial)

    @property
    def status(self) -> str:
        """The record's status; a trial Optuna failed while it was running (its driver
        died) reads as interrupted, a retry not yet asked as queued."""
        if self.state == "WAITING":
            return "queued"  # a retry Optuna holds for the next ask
        if self.record.status == "running" and self.state == "FAIL":
            return "interrupted"
        return self.record.status

    @property
    def candidate(self) -> Candidate:
        assert self.record.candidate is not None, f"trial {self.number} has no candidate"
        return self.record.candidate

    @property
    def is_evaluation(self) -> bool:
        """An evaluation of its own candidate (not a repeated proposal, not a re-probe, not
        a retry still waiting to be asked)."""
        record = self.record
        return (
            record.candidate is not None
            and self.state != "WAITING"
            and record.duplicate_of is None
            and record.confirmation_of is None
        )

    @property
    def probed(self) -> bool:
        """A probe ran (or is running) for it."""
        return self.is_evaluation and (self.record.probe_wall_s is not None or self.running)

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def measured_in_full(self) -> bool:
        return self.status == "ok" and not self.record.stopped_early

    @property
    def feasible(self) -> bool:
        """Measured in full and within the limit: a config that may be exported."""
        return (
            self.is_evaluation
            and self.state == "COMPLETE"
            and self.measured_in_full
            and self.record.feasible
            and self.value is not None
        )

    @property
    def label(self) -> str:
        return self.record.label


def view_of(trial: optuna.Trial) -> TrialView:
    """The view of one live (or just told) trial, read back from the storage."""
    return TrialView.of(trial.storage.get_trial(trial_id(trial)))


def views(study: optuna.Study) -> list[TrialView]:
    """Every trial of ``study``, in number order."""
    return [TrialView.of(t) for t in study.get_trials(deepcopy=False)]


def evaluations(trials: list[TrialView]) -> list[TrialView]:
    return [t for t in trials if t.is_evaluation]


def ranked_feasible(trials: list[TrialView], goal: TrainingGoal | None = None) -> list[TrialView]:
    """Feasible trials measured in full, best first by ``goal``'s score (fastest first
    without one, as under the throughput objective)."""
    feasible = [t for t in trials if t.feasible]
    if goal is None:
        return sorted(feasible, key=lambda t: t.value or 0.0, reverse=True)
    return sorted(
        feasible,
        key=lambda t: goal.score(float(t.value or 0.0), t.candidate.data_parallel_size),
        reverse=True,
    )


def fastest_per_world_size(trials: list[TrialView]) -> list[TrialView]:
    """The fastest feasible trial at each world size the study measured, smallest first
    (a study that searched them, ``--gpus 1-8``)."""
    fastest: dict[int, TrialView] = {}
    for trial in ranked_feasible(trials):
        fastest.setdefault(trial.candidate.data_parallel_size, trial)
    return [fastest[size] for size in sorted(fastest)]


def world_size_lines(trials: list[TrialView], goal: TrainingGoal | None = None) -> list[str]:
    """One line per world size measured: its fastest configuration, its samples/s, what
    each GPU contributes (the scaling a larger world buys) and, where ``goal`` gives a size
    or a price, its time and cost to train."""
    front = fastest_per_world_size(trials)
    if len(front) < 2:
        return []
    lines = []
    for trial in front:
        size, rate = trial.candidate.data_parallel_size, float(trial.value or 0.0)
        outcome = goal.outcome(rate, size) if goal is not None else ""
        lines.append(
            f"- {size} GPU(s): {trial.candidate.label} (trial {trial.number}), {rate:.1f} "
            f"samples/s, {rate / size:.1f} per GPU" + (f"; {outcome}" if outcome else "")
        )
    return lines


# -- recording outcomes: record fields, the memory constraint and Optuna's state together --
CONSTRAINT = "peak_over_limit_bytes"


def trial_id(trial: optuna.Trial) -> int:
    """The storage's id of a live trial, through the storage's public lookups."""
    storage = trial.storage
    return storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name(trial.study.study_name), trial.number
    )


def set_constraint(trial: optuna.Trial, value: float) -> None:
    """Optuna 5's per-key constraint, plus the legacy list that optuna-dashboard 0.21 reads
    to grey out infeasible trials (its serializer knows only the "constraints" list)."""
    trial.set_constraint(CONSTRAINT, value)
    trial.storage.set_trial_system_attr(trial_id(trial), "constraints", [value])


def record_probe(
    study: optuna.Study, trial: optuna.Trial, record: TrialRecord, result: ProbeResult
) -> TrialRecord:
    """Write a probe's outcome over ``record`` (what was known before the probe, its limits
    included) and tell Optuna: ok -> COMPLETE with samples/s (an early-stopped probe too: a
    true if short measurement, never exported; one over a limit too, infeasible, its error
    saying which); oom -> PRUNED and infeasible (no invented value); error/timeout -> FAIL.
    The constraint is how far the measurement is over its limits (:func:`measured_excess`),
    positive for an OOM."""
    from optuna.trial import TrialState

    over_bytes, why = measured_excess(result, record.vram_limit_bytes, record.host_ram_bytes)
    if result.status == "oom":
        over_bytes = max(over_bytes, 1)
    final = record.model_copy(
        update={
            "status": result.status,
            "error": why if result.status == "ok" else result.error,
            **_measurements(result),
            "feasible": result.status == "ok" and over_bytes <= 0,
            "log_tail": ""
            if result.status == "ok"
            else "\n".join(result.log_tail.strip().splitlines()[-20:]),
            "pruned_by": "early stop: clearly slower than the best so far"
            if result.stopped_early
            else "",
        }
    )
    write(trial, final)
    if result.status in MEASURED_STATUSES:
        set_constraint(trial, float(over_bytes))
    if result.status == "ok":
        study.tell(trial, result.samples_per_s)
    elif result.status == "oom":
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)
    return final


def _measurements(result: ProbeResult) -> dict[str, Any]:
    """The record's fields that copy what a probe measured."""
    return {
        **copy_parts(result, Throughput, DevicePeaks, HostPeaks, Versions),
        "peak_bytes": result.peak_bytes,
        "overhead_bytes": max(result.overhead_bytes_per_rank, default=0),
        "probe_wall_s": result.wall_s,
        "probe_init_s": result.init_s,
        "probe_timed_s": result.timed_s,
        "probe_cold_start": result.cold_start,
    }


def measured_excess(
    result: ProbeResult, vram_limit_bytes: int, host_ram_bytes: int
) -> tuple[int, str]:
    """How far a probe's measurement is over its limits, in bytes (<= 0: within them, by
    the tightest margin), and why it is over (empty when within): the worst rank's device
    peak against the limit per rank, and each node's ranks' host peaks, summed, against
    ``host_ram_bytes`` (0: not judged). Host memory is judged on CPU ranks too: there the
    limit bounds the tensors a rank holds, while host RAM holds the whole processes
    (interpreter, libraries, allocator caches)."""
    from autotune.units import format_bytes

    device_over = result.peak_bytes - vram_limit_bytes
    overs, reasons = [device_over], []
    if device_over > 0:
        reasons.append(
            f"measured peak {format_bytes(result.peak_bytes)} per rank is over the limit "
            f"{format_bytes(vram_limit_bytes)}"
        )
    per_node = result.host_peak_per_node() if host_ram_bytes > 0 else {}
    if per_node:
        node = max(per_node, key=lambda n: per_node[n])
        overs.append(per_node[node] - host_ram_bytes)
    if per_node and overs[-1] > 0:
        ranks = [n for n in result.node_per_rank if n == node] or result.host_peak_bytes_per_rank
        reasons.append(
            f"measured host memory {format_bytes(per_node[node])} on node {node or '?'} "
            f"({len(ranks)} rank(s)) is over --host-ram {format_bytes(host_ram_bytes)} by "
            f"{format_bytes(overs[-1])} ({HOST_PEAK_WORDS[result.host_peak_method]}, summed "
            "over the node's ranks)"
        )
    return max(overs), "; ".join(reasons)


def record_pruned(
    study: optuna.Study, trial: optuna.Trial, record: TrialRecord, over_bytes: float
) -> None:
    """A candidate judged infeasible without a probe (``record`` says by what and why):
    PRUNED and infeasible, never failed."""
    from optuna.trial import TrialState

    write(trial, record.model_copy(update={"status": "pruned", "feasible": False}))
    set_constraint(trial, max(float(over_bytes), 1.0))
    study.tell(trial, state=TrialState.PRUNED)


def record_duplicate(study: optuna.Study, trial: optuna.Trial, original: TrialView) -> None:
    """The sampler proposed a candidate the study already evaluated: the original's record,
    state, value and constraint are copied (Optuna's FAQ recipe); nothing is probed."""
    from optuna.trial import TrialState

    write(trial, original.record.model_copy(update={"duplicate_of": original.number}))
    constraint = original.frozen.constraints.get(CONSTRAINT)
    if constraint is not None:
        set_constraint(trial, constraint)
    if original.state == "COMPLETE":
        study.tell(trial, original.value)
    else:
        study.tell(trial, state=TrialState[original.state])


def record_running_duplicate(
    study: optuna.Study, trial: optuna.Trial, candidate: Candidate, original: int
) -> None:
    """Proposed while the same candidate is still being probed: nothing to copy yet, so the
    trial is closed as FAIL (samplers skip FAIL trials) and marked as a duplicate."""
    from optuna.trial import TrialState

    record = TrialRecord(
        candidate=candidate,
        candidate_key=candidate.key,
        label=candidate.label,
        status="duplicate",
        duplicate_of=original,
    )
    write(trial, record)
    study.tell(trial, state=TrialState.FAIL)


def record_interrupted(
    study: optuna.Study,
    trial: optuna.Trial,
    record: TrialRecord,
    why: str = "interrupted: the run was stopped during the probe",
) -> None:
    """A probe stopped by something other than its candidate (Ctrl-C, a lost lock, its node
    leaving the cluster): FAIL with status interrupted, so the candidate is probed again."""
    from optuna.trial import TrialState

    write(trial, record.model_copy(update={"status": "interrupted", "error": why}))
    study.tell(trial, state=TrialState.FAIL)
