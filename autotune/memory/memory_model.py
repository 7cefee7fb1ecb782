"""Predicted peak memory of a candidate, per rank, before any probe runs.

``MemoryModel.predict(candidate)`` returns a :class:`MemoryEstimate` for the device and the
host, broken into parameters, gradients, optimizer states, activations, communication
buckets and workspace, and says which phase of a step peaks.

The training backend states its own terms (its role :class:`autotune.backends.BackendMemory`):
the steady model states a rank holds after the first optimizer step and what the backend
allocates on top of them, phase by phase of a step. For DeepSpeed's ZeRO these are
:mod:`autotune.backends.deepspeed._model_states` and
:mod:`autotune.backends.deepspeed._zero_phases`.

Activations come from :mod:`autotune.memory.activations` (the workload's real forward and
backward on fake tensors, traced with the kernels of the ranks' accelerator: CUDA's fused
attention keeps no sequence x sequence matrix, the CPU's math path does).
:class:`Calibration` corrects predictions by the ratio of measured to predicted peaks of
the study's completed probes.
"""

from __future__ import annotations

import functools
import statistics
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from autotune.backends import Breakdown, ModelFacts, get_backend
from autotune.backends.deepspeed import (
    DEFAULT_MAX_LIVE,
    DEFAULT_PERSISTENCE_THRESHOLD,
    DEFAULT_PREFETCH_BUCKET,
    DEFAULT_REDUCE_BUCKET,
)
from autotune.candidate import Candidate
from autotune.hardware import Accelerator
from autotune.workloads.blocks import block_params, shard_units

if TYPE_CHECKING:
    from autotune.backends import BackendMemory
    from autotune.workloads import Workload

MiB = 2**20


class MemoryEstimate(BaseModel):
    """A candidate's predicted peak per rank, on the device and on the host."""

    model_config = ConfigDict(extra="forbid")

    device: Breakdown = Field(description="The device at its peak phase.")
    host: Breakdown = Field(description="Host memory holding offloaded states and buffers.")
    phase: str = Field(description="Phase of the step where the device peaks.")
    correction: float = Field(default=1.0, description="Calibration factor applied.")
    one_ram_peak: float | None = Field(
        default=None,
        description="The most device and host hold together in one phase (before "
        "calibration); None: the device's peak beside the host's.",
    )

    @property
    def device_bytes(self) -> int:
        return int(self.device.total * self.correction)

    @property
    def host_bytes(self) -> int:
        return int(self.host.total)

    def tracked_bytes(self, accelerator: str) -> int:
        """What the probe measures: device bytes on CUDA; on CPU ranks every tensor,
        offloaded ones included, lives in the same RAM and is tracked."""
        if accelerator == "cuda":
            return self.device_bytes
        together = self.one_ram_peak
        if together is None:
            together = self.device.total + self.host.total
        return int(together * self.correction)


@functools.lru_cache(maxsize=32)
def model_facts(workload: Workload, persistence_threshold: int) -> ModelFacts:
    """Parameter counts from the model built on the meta device (no memory, no weights);
    kept on disk between runs where the workload has a fingerprint (:mod:`.trace_cache`)."""
    from autotune.memory import _trace_cache as trace_cache

    return trace_cache.kept_or_made(
        workload,
        trace_cache.facts_name(persistence_threshold),
        ModelFacts,
        lambda: _counted(workload, persistence_threshold),
    )


def _counted(workload: Workload, persistence_threshold: int) -> ModelFacts:
    import torch

    with torch.device("meta"):
        model = workload.build_model()
    unique = {id(p): p for p in model.parameters()}.values()
    numels = [p.numel() for p in unique]
    active = getattr(workload, "active_params", None)  # user workloads may predate it
    in_blocks, largest_block = block_params(shard_units(workload, model))
    return ModelFacts(
        block_params=in_blocks,
        largest_block_params=largest_block,
        params=sum(numels),
        largest_param=max(numels),
        small_params=sum(n for n in numels if n < persistence_threshold),
        active_params=active(model) if callable(active) else sum(numels),
    )


class Calibration(BaseModel):
    """Measured / predicted peak ratios of a study's probes, by (stage or FSDP2,
    precision)."""

    model_config = ConfigDict(extra="forbid")

    ratios: dict[str, list[float]] = Field(default_factory=dict)

    @staticmethod
    def key(candidate: Candidate) -> str:
        group = get_backend(candidate.backend).calibration_group(candidate)
        return f"{group}-{candidate.precision}"

    def add(self, candidate: Candidate, predicted_bytes: int, measured_bytes: int) -> None:
        if predicted_bytes > 0 and measured_bytes > 0:
            self.ratios.setdefault(self.key(candidate), []).append(measured_bytes / predicted_bytes)

    def factor(self, candidate: Candidate) -> float:
        """The median ratio of the same class, else of all probes, else 1."""
        same = self.ratios.get(self.key(candidate))
        every = [r for values in self.ratios.values() for r in values]
        chosen = same or every
        return statistics.median(chosen) if chosen else 1.0


class MemoryModel:
    """Predicts per-rank peak memory for candidates of one workload, on ranks of
    ``accelerator`` (whose kernels the activation traces follow)."""

    def __init__(
        self,
        workload: Workload,
        *,
        accelerator: Accelerator = "cpu",
        base_config: dict[str, Any] | None = None,
        calibration: Calibration | None = None,
        backend: BackendMemory | None = None,
    ) -> None:
        self.workload = workload
        self.accelerator = accelerator
        self.backend = backend  # None: each candidate's own
        self.base_zero = dict((base_config or {}).get("zero_optimization") or {})
        self.calibration = calibration or Calibration()
        self._facts: ModelFacts | None = None

    def _knob(self, candidate: Candidate, name: str, default: int) -> int:
        value = getattr(candidate.zero_knobs, name, None)
        if value is None:
            value = self.base_zero.get(name, default)
        return int(value)

    def facts(self, candidate: Candidate) -> ModelFacts:
        threshold = self._knob(
            candidate, "stage3_param_persistence_threshold", DEFAULT_PERSISTENCE_THRESHOLD
        )
        return model_facts(self.workload, threshold)

    def backend_of(self, candidate: Candidate) -> BackendMemory:
        """The backend that states ``candidate``'s memory terms."""
        return self.backend or get_backend(candidate.backend)

    def model_states(self, candidate: Candidate) -> tuple[Breakdown, Breakdown]:
        """Steady (device, host) model states per rank after the first optimizer step."""
        return self.backend_of(candidate).model_states(candidate, self.facts(candidate))

    def _bucket(self, candidate: Candidate) -> float:
        elements = self._knob(candidate, "reduce_bucket_size", DEFAULT_REDUCE_BUCKET)
        return elements * (4.0 if candidate.precision == "fp32" else 2.0)

    def predict(self, candidate: Candidate, *, stop_above: float | None = None) -> MemoryEstimate:
        """The peak per rank. With ``stop_above``, a candidate whose model states alone
        exceed it is returned at once (phase ``model states``), without tracing."""
        from autotune.memory.activations import profile

        facts = self.facts(candidate)
        stage = candidate.zero_stage
        device, host = self.model_states(candidate)
        if self.backend_of(candidate).holds_reduce_bucket(candidate):
            device.buckets += self._bucket(candidate)
        correction = self.calibration.factor(candidate)
        if stop_above is not None and device.total * correction > stop_above:
            return MemoryEstimate(
                device=device, host=host, phase="model states", correction=correction
            )
        # With accumulation, later micro-batches run with the gradients of earlier ones held
        # (ZeRO 0-1 keep parameter gradients until the step, and each new gradient exists
        # beside the held one until autograd adds it: for GPT-2 at ZeRO-1, one more copy of
        # the tied embedding's gradient, measured in benchmarks/RESULTS.md); ZeRO 2-3 drop each
        # gradient into a bucket as it is produced.
        accumulating = candidate.gradient_accumulation_steps > 1
        kind = ("accumulate" if accumulating else "kept") if stage <= 1 else "dropped"
        act = profile(
            self.workload,
            candidate.micro_batch_size,
            candidate.precision,
            candidate.checkpoint_fraction,
            kind,  # type: ignore[arg-type]
            self.accelerator,
            candidate.checkpoint_policy,
            candidate.activation_offload,
        )
        knobs = {
            name: self._knob(candidate, name, default)
            for name, default in (
                ("reduce_bucket_size", DEFAULT_REDUCE_BUCKET),
                ("stage3_max_live_parameters", DEFAULT_MAX_LIVE),
                ("stage3_prefetch_bucket_size", DEFAULT_PREFETCH_BUCKET),
            )
        }
        backend = self.backend_of(candidate)
        host_at = backend.host_phases(candidate, facts, host)
        phases, host = backend.transient_phases(candidate, facts, act, knobs, host)
        phase, extra = max(phases.items(), key=lambda item: item[1].total)
        one_ram = None
        if host_at:
            one_ram = act.offloaded_bytes + max(
                device.total + extra_at.total + host_at.get(name, host).total
                for name, extra_at in phases.items()
            )
        # the kept blocks' offloaded activations, on the host through forward and backward
        host = host.plus(Breakdown(activations=act.offloaded_bytes))
        return MemoryEstimate(
            device=device.plus(extra),
            host=host,
            phase=phase,
            correction=correction,
            one_ram_peak=one_ram,
        )


@functools.lru_cache(maxsize=32)
def largest_layer_params(workload: Workload) -> int:
    """DeepSpeed's "largest layer": the most parameters any one module owns directly."""
    import torch

    with torch.device("meta"):
        model = workload.build_model()
    return max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
