"""Activation memory of a workload, traced on fake tensors: no GPU and no real memory.

The workload's real forward and backward run under PyTorch's ``FakeTensorMode`` (shapes and
dtypes only) with a :class:`~autotune.memtrack.TensorMemoryTracker` on top, so the peak is
the same live-storage count the CPU probe measures, taken over the same operators. Two kinds
of trace exist, as DeepSpeed's stages treat gradients differently:

- ``kept``: gradients stay on their parameters (ZeRO 0-1); with ``accumulate`` a second
  micro-batch runs with the first one's gradients held, as in gradient accumulation;
- ``dropped``: each gradient is released as soon as it is produced (ZeRO 2-3 hooks move it
  into a reduction bucket).

For a stack of identical blocks a trace is linear in the number of blocks: two short
stacks are traced and the line extrapolated, so a 70B model costs small traces. It is not
linear in the micro-batch (where the backward peak falls moves with it, with checkpointing
most of all), so each micro-batch is traced. Fake models are built once per stack depth,
dtype and checkpointing, and reused across micro-batches.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from autotune.workloads import Workload

# Stack depths traced for extrapolation.
TRACE_LAYERS = (1, 2)
Kind = Literal["kept", "accumulate", "dropped"]


class ActivationProfile(BaseModel):
    """Bytes beyond the parameters during one micro-batch's forward and backward."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    forward_peak_bytes: float
    backward_peak_bytes: float
    at_first_grad_bytes: float


def _dtype_name(precision: str) -> str:
    return "fp32" if precision == "fp32" else "bf16"  # fp16 and bf16 have equal sizes


class _FakeModel:
    """A workload's model on fake tensors, with hooks that can keep or drop gradients."""

    def __init__(self, workload: Workload, dtype_name: str, checkpointing: bool) -> None:
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        self.workload = workload
        self.mode = FakeTensorMode()
        self.keep_grads = True
        self.first_grad: list[int] = []
        self.tracker: Any = None
        previous = torch.get_default_dtype()
        with self.mode:
            # Built in the target dtype: Module.to() cannot swap fake parameters in place.
            torch.set_default_dtype(dtype)
            try:
                self.model = workload.build_model()
            finally:
                torch.set_default_dtype(previous)
            if checkpointing:
                workload.enable_activation_checkpointing(self.model)
            self.model.train()
        self.parameters = list(self.model.parameters())
        for parameter in self.parameters:
            parameter.register_post_accumulate_grad_hook(self._on_grad)

    def _on_grad(self, parameter: Any) -> None:
        if not self.first_grad and self.tracker is not None:
            self.first_grad.append(self.tracker.live_bytes)
        if not self.keep_grads:
            parameter.grad = None

    def trace(self, micro_batch_size: int, kind: Kind) -> ActivationProfile:
        import torch

        from autotune.memtrack import TensorMemoryTracker

        self.keep_grads = kind != "dropped"
        self.first_grad = []
        for parameter in self.parameters:
            parameter.grad = None
        with self.mode, TensorMemoryTracker() as tracker:
            # A fresh tracker counts what comes on top of the parameters (and of views of
            # them, which it must not take for new storages).
            tracker.ignore(self.parameters)
            self.tracker = tracker
            batch = self.workload.make_batch(micro_batch_size, torch.device("cpu"))
            loss = self.workload.loss(self.model, batch)
            forward_peak = tracker.peak_bytes
            tracker.reset_peak()
            loss.backward()
            backward_peak = tracker.peak_bytes
            del loss
            if kind == "accumulate":
                tracker.reset_peak()
                self.workload.loss(self.model, batch).backward()
                backward_peak = max(backward_peak, tracker.peak_bytes)
            self.tracker = None
        for parameter in self.parameters:
            parameter.grad = None
        return ActivationProfile(
            forward_peak_bytes=forward_peak,
            backward_peak_bytes=backward_peak,
            at_first_grad_bytes=self.first_grad[0] if self.first_grad else backward_peak,
        )


@functools.lru_cache(maxsize=16)
def _fake_model(workload: Workload, dtype_name: str, checkpointing: bool) -> _FakeModel:
    return _FakeModel(workload, dtype_name, checkpointing)


@functools.lru_cache(maxsize=1024)
def _depth(workload: Workload) -> tuple[int | None, Any]:
    layers = getattr(workload, "num_layers", None)
    with_layers = getattr(workload, "with_layers", None)
    if layers is None or with_layers is None or layers <= max(TRACE_LAYERS):
        return None, None
    return layers, with_layers


def trace_once(
    workload: Workload,
    micro_batch_size: int,
    precision: str,
    checkpointing: bool,
    kind: Kind = "kept",
) -> ActivationProfile:
    """One trace of the whole model (no extrapolation)."""
    return _fake_model(workload, _dtype_name(precision), checkpointing).trace(
        micro_batch_size, kind
    )


@functools.lru_cache(maxsize=1024)
def profile(
    workload: Workload,
    micro_batch_size: int,
    precision: str,
    checkpointing: bool,
    kind: Kind = "kept",
) -> ActivationProfile:
    """The activation profile of ``kind`` at a micro-batch, extrapolated over blocks."""
    layers, with_layers = _depth(workload)
    if layers is None:
        return trace_once(workload, micro_batch_size, precision, checkpointing, kind)
    short, longer = TRACE_LAYERS
    a = trace_once(with_layers(short), micro_batch_size, precision, checkpointing, kind)
    b = trace_once(with_layers(longer), micro_batch_size, precision, checkpointing, kind)
    values = {}
    for field in ActivationProfile.model_fields:
        low, high = getattr(a, field), getattr(b, field)
        values[field] = max(0.0, low + (high - low) * (layers - short) / (longer - short))
    return ActivationProfile(**values)
