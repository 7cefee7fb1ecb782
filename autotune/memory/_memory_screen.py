"""Whether a candidate may fit, and why not: the memory model, its calibration by the
study's own probes, and monotonicity in the micro-batch.

- An OOM at micro-batch m rules out larger micro-batches of the same shape (the candidate
  without its batch split); a fit at m vouches for smaller ones, whatever the model says
  (the measurement wins).
- Otherwise the memory model's prediction (calibrated by the ratio of measured to
  predicted peaks of the study's probes) must stay under the limit less the margin, and on
  CUDA the host memory of every rank of every probe running at once on a node must fit the
  node's RAM. On CUDA the limit is first reduced by the largest memory outside the caching
  allocator (the CUDA context, NCCL's communicators and buffers, cuBLAS) the study's probes
  measured at the candidate's world size: the model predicts what tensors allocate, and a
  probe's allocator gets the limit less that overhead (:mod:`autotune.probe._cuda_memory`),
  as a card of the limit's size would leave its tensors.

:class:`MemoryScreen` is consulted by the tuner before each probe and by autotune's sampler
(through :meth:`MemoryScreen.may_fit`) before proposing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from autotune.candidate import Candidate
from autotune.memory.memory_model import Calibration
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.hardware import Accelerator
    from autotune.memory.memory_model import MemoryModel
    from autotune.memory.script_memory import ScriptMemoryModel
    from autotune.study import TrialView
    from autotune.workloads import Workload


def shape_key(candidate: Candidate) -> str:
    """The candidate without its batch split (what memory monotonicity speaks about)."""
    return candidate.model_copy(
        update={"micro_batch_size": 1, "gradient_accumulation_steps": 1}
    ).key


@dataclass
class Monotonicity:
    """What probes have shown about micro-batches of each shape."""

    oom_floor: dict[str, tuple[int, int]] = field(default_factory=dict)  # shape -> (mb, trial)
    fit_ceiling: dict[str, int] = field(default_factory=dict)  # shape -> largest that fitted

    def add(self, candidate: Candidate, status: str, trial: int) -> None:
        shape = shape_key(candidate)
        if status == "oom":
            floor = self.oom_floor.get(shape)
            if floor is None or candidate.micro_batch_size < floor[0]:
                self.oom_floor[shape] = (candidate.micro_batch_size, trial)
        elif status == "ok":
            ceiling = self.fit_ceiling.get(shape, 0)
            self.fit_ceiling[shape] = max(ceiling, candidate.micro_batch_size)

    def known_to_fit(self, candidate: Candidate) -> bool:
        return candidate.micro_batch_size <= self.fit_ceiling.get(shape_key(candidate), 0)

    def ruled_out_by(self, candidate: Candidate) -> tuple[int, int] | None:
        """(micro-batch, trial) of the OOM that rules ``candidate`` out, if one does."""
        floor = self.oom_floor.get(shape_key(candidate))
        if floor is not None and candidate.micro_batch_size > floor[0]:
            return floor
        return None


def failure_key(error: str) -> str:
    """A failure's text without what differs between candidates (ranks, sizes, paths)."""
    return re.sub(r"\d+", "#", error.split(" (`")[0].strip().lower())[:300]


@dataclass
class SameFailures:
    """Probes of one precision that all fail alike (a script or model that cannot run in
    it, e.g. inputs in fp32 to a bf16 model): after :data:`SAME_FAILURES` of them, at two
    ZeRO stages or more and with no probe of that precision measured, the precision is not
    probed further."""

    failed: dict[tuple[str, str], list[tuple[int, int]]] = field(default_factory=dict)
    fitted: set[str] = field(default_factory=set)  # precisions a probe measured
    texts: dict[tuple[str, str], str] = field(default_factory=dict)

    def add(self, candidate: Candidate, error: str, trial: int) -> None:
        key = (candidate.precision, failure_key(error))
        self.failed.setdefault(key, []).append((trial, candidate.zero_stage))
        self.texts.setdefault(key, error)

    def add_fit(self, candidate: Candidate) -> None:
        self.fitted.add(candidate.precision)

    def stopped(self, precision: str) -> str:
        """Why ``precision`` is not probed further ('' while it is)."""
        if precision in self.fitted:
            return ""
        for (failed_precision, key), trials in self.failed.items():
            stages = {stage for _, stage in trials}
            if failed_precision == precision and len(trials) >= SAME_FAILURES and len(stages) > 1:
                numbers = ", ".join(str(t) for t, _ in trials[:5])
                return (
                    f"every {precision} probe failed alike (trials {numbers}: "
                    f"{self.texts[(failed_precision, key)][:200]}); {precision} is not probed "
                    "further: fix the cause, then continue with --retry-failed"
                )
        return ""


SAME_FAILURES = 2


class Prediction(BaseModel):
    """The memory model's word on one candidate, as a trial records it."""

    model_config = ConfigDict(extra="forbid")

    predicted_peak_bytes: int
    predicted_raw_bytes: int
    predicted_host_bytes: int
    predicted_phase: str
    memory_correction: float


class Verdict(BaseModel):
    """Fits (``pruned_by`` empty), or what rules it out and why."""

    model_config = ConfigDict(extra="forbid")

    pruned_by: str = ""
    reason: str = ""
    over_bytes: float = 0.0
    oom_trial: int | None = None
    prediction: Prediction | None = None

    @property
    def fits(self) -> bool:
        return not self.pruned_by


@dataclass(frozen=True)
class Limits:
    """What a candidate must fit into."""

    accelerator: Accelerator
    vram_limit_bytes: int
    margin: float
    host_ram_bytes: int
    ranks_per_node: int  # ranks of all probes that may run at once on one node

    def threshold_bytes(self, overhead_bytes: int = 0) -> float:
        """What a candidate's predicted tensors may reach: the limit less the memory
        outside the allocator (``overhead_bytes``), less the margin."""
        return max(0, self.vram_limit_bytes - overhead_bytes) * (1.0 - self.margin)


class MemoryScreen:
    """The memory model (None: ``--no-prune``, only measured OOMs rule out) and what the
    study's probes taught it."""

    def __init__(
        self,
        workload: Workload,
        limits: Limits,
        *,
        base_config: dict | None = None,
        use_model: bool = True,
    ) -> None:
        self.limits = limits
        # the largest memory outside the allocator the study's probes measured (CUDA), by
        # world size: NCCL's communicators and buffers grow with the ranks they connect
        self.overhead_bytes_by_world: dict[int, int] = {}
        self.calibration = Calibration()
        self.monotonicity = Monotonicity()
        self.failures = SameFailures()
        self._workload = workload
        self._base_config = base_config
        self._use_model = use_model
        self._model: MemoryModel | None = None

    @property
    def model(self) -> MemoryModel | ScriptMemoryModel | None:
        if not self._use_model:
            return None
        if self._model is None:
            if getattr(self._workload, "script", None) is not None:
                # a user's script: its model is known only from its probes
                from autotune.memory.script_memory import ScriptMemoryModel

                self._model = ScriptMemoryModel(self.limits.accelerator, self._base_config)
                return self._model
            from autotune.memory.memory_model import MemoryModel

            self._model = MemoryModel(
                self._workload,
                accelerator=self.limits.accelerator,
                base_config=self._base_config,
                calibration=self.calibration,
            )
        return self._model

    def learn(self, trial: TrialView) -> None:
        """Take what one evaluated trial showed (an OOM, a fit and its measured peak, a
        failure)."""
        record = trial.record
        if record.candidate is not None and trial.status == "error":
            self.failures.add(record.candidate, record.error, trial.number)
        if record.candidate is None or trial.status not in ("ok", "oom"):
            return
        self.failures.add_fit(record.candidate)
        self.monotonicity.add(record.candidate, trial.status, trial.number)
        model = self.model
        if model is not None and hasattr(model, "learn"):
            model.learn(trial)
        world = record.candidate.data_parallel_size
        known = self.overhead_bytes_by_world.get(world, 0)
        self.overhead_bytes_by_world[world] = max(known, record.overhead_bytes)
        if trial.status == "ok" and record.predicted_raw_bytes:
            # the model predicts what tensors allocate; on CUDA the reserved peak also holds
            # the caching allocator's slack and the context, outside the model
            measured = max(record.peak_bytes_per_rank, default=record.peak_bytes)
            self.calibration.add(record.candidate, record.predicted_raw_bytes, measured)

    def forget_failures(self) -> None:
        """The study's failed probes stop their precision no more (``--retry-failed``: their
        candidates are probed again); the precisions measured stay measured."""
        self.failures = SameFailures(fitted=set(self.failures.fitted))

    def verdict(self, candidate: Candidate) -> Verdict:
        """Whether to probe ``candidate``, with the prediction a trial records."""
        stopped = self.failures.stopped(candidate.precision)
        if stopped:
            return Verdict(pruned_by=f"{candidate.precision} stopped", reason=stopped)
        floor = self.monotonicity.ruled_out_by(candidate)
        if floor is not None:
            return Verdict(
                pruned_by=f"oom at micro-batch {floor[0]}",
                reason=f"micro-batch {candidate.micro_batch_size} is larger than {floor[0]}, "
                f"which ran out of memory in trial {floor[1]}",
                over_bytes=1.0,
                oom_trial=floor[1],
            )
        verdict = self.predict(candidate)
        if not verdict.fits and self.monotonicity.known_to_fit(candidate):
            # a larger micro-batch of it fitted: the measurement wins
            return Verdict(prediction=verdict.prediction)
        return verdict

    def may_fit(self, candidate: Candidate) -> bool:
        """What the memory model says before any probe (the sampler skips the rest)."""
        return not self.failures.stopped(candidate.precision) and self.predict(candidate).fits

    def predict(self, candidate: Candidate) -> Verdict:
        model = self.model
        if model is None:
            return Verdict()
        limits = self.limits
        estimate = model.predict(candidate)
        if estimate is None:  # a script's model before its probes have shown enough
            return Verdict()
        predicted = estimate.tracked_bytes(limits.accelerator)
        prediction = Prediction(
            predicted_peak_bytes=predicted,
            predicted_raw_bytes=int(predicted / estimate.correction),
            predicted_host_bytes=estimate.host_bytes,
            predicted_phase=estimate.phase,
            memory_correction=estimate.correction,
        )
        overhead = self.outside_allocator_bytes(candidate.data_parallel_size)
        threshold = limits.threshold_bytes(overhead)
        if predicted > threshold:
            outside = (
                f" the {format_bytes(overhead)} measured outside the allocator "
                "(CUDA context, communicators) and"
                if overhead
                else ""
            )
            return Verdict(
                pruned_by="memory-model",
                reason=f"predicted peak {format_bytes(predicted)} per rank exceeds the limit "
                f"{format_bytes(limits.vram_limit_bytes)} less{outside} the "
                f"{100 * limits.margin:.0f}% margin",
                over_bytes=predicted - threshold,
                prediction=prediction,
            )
        # On CPU ranks host and device are the same RAM, and offloaded tensors count in the
        # tracked peak already.
        host = estimate.host_bytes * limits.ranks_per_node
        if limits.accelerator == "cuda" and host > limits.host_ram_bytes:
            return Verdict(
                pruned_by="memory-model",
                reason=f"predicted host memory {format_bytes(host)} for the "
                f"{limits.ranks_per_node} rank(s) a node runs at once exceeds --host-ram "
                f"{format_bytes(limits.host_ram_bytes)}",
                over_bytes=host - limits.host_ram_bytes,
                prediction=prediction,
            )
        return Verdict(prediction=prediction)

    def outside_allocator_bytes(self, world_size: int) -> int:
        """What the limit of a candidate on ``world_size`` ranks loses to memory outside
        the allocator: the most the study's probes at that world size measured there, else
        at the nearest larger one measured (communicators grow with the ranks), else at the
        largest measured; none for a script's model, which is learnt from measured peaks
        that hold it already (the reserved peak plus what lies outside)."""
        measured = self.overhead_bytes_by_world
        if getattr(self._workload, "script", None) is not None or not measured:
            return 0
        larger = [w for w in measured if w >= world_size]
        return measured[min(larger)] if larger else measured[max(measured)]

    def screened(self, candidates: list[Candidate], evaluated: set[str]) -> list[str]:
        """Keys of unevaluated candidates the model rules out before any probe (those a fit
        of a larger micro-batch vouches for are not)."""
        if self.model is None:
            return []
        return [
            c.key
            for c in candidates
            if c.key not in evaluated
            and not self.monotonicity.known_to_fit(c)
            and not self.may_fit(c)
        ]
