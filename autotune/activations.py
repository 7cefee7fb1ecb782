"""Activation memory of a workload, traced on fake tensors: no GPU and no real memory.

The workload's real forward and backward run under PyTorch's ``FakeTensorMode`` (shapes and
dtypes only) with a :class:`~autotune.memtrack.TensorMemoryTracker` on top, so the peak is
the same live-storage count the CPU probe measures, taken over the same operators. A
:class:`ActivationProfile` holds, beyond the parameters: the forward peak, the backward
peak with gradients kept (ZeRO 0-1 keep them until the step) and the live bytes when the
first gradient is produced (where ZeRO 1-2 allocate their reduction bucket).

Traces are linear in the micro-batch and, for a stack of identical blocks, in the number of
blocks; :func:`profile` traces two micro-batches on two short stacks and extrapolates, so a
70B model costs four small traces.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from autotune.workloads import Workload

# Traced stacks for extrapolation (a stack of 1 block can differ in its tail handling).
TRACE_LAYERS = (2, 3)
TRACE_MICRO_BATCHES = (1, 2)


class ActivationProfile(BaseModel):
    """Bytes beyond the parameters during one micro-batch's forward and backward."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    forward_peak_bytes: float
    backward_peak_bytes: float
    backward_peak_nograd_bytes: float
    at_first_grad_bytes: float

    def __add__(self, other: ActivationProfile) -> ActivationProfile:
        return ActivationProfile(**{k: getattr(self, k) + getattr(other, k) for k in _FIELDS})

    def scaled(self, factor: float) -> ActivationProfile:
        return ActivationProfile(**{k: getattr(self, k) * factor for k in _FIELDS})


_FIELDS = (
    "forward_peak_bytes",
    "backward_peak_bytes",
    "backward_peak_nograd_bytes",
    "at_first_grad_bytes",
)


def _linear(
    x0: float, y0: ActivationProfile, x1: float, y1: ActivationProfile, x: float
) -> ActivationProfile:
    """Line through (x0, y0) and (x1, y1), at x; never below zero."""
    slope = (y1 + y0.scaled(-1)).scaled(1 / (x1 - x0))
    value = y0 + slope.scaled(x - x0)
    return ActivationProfile(**{k: max(0.0, getattr(value, k)) for k in _FIELDS})


def trace_once(
    workload: Workload, micro_batch_size: int, dtype_name: str, checkpointing: bool
) -> ActivationProfile:
    """Two traced forward + backward passes of ``workload`` under FakeTensorMode: one
    keeping gradients (ZeRO 0-1), one dropping each as it is produced (ZeRO 2-3, whose
    hooks move it into a bucket)."""
    kept = _trace(workload, micro_batch_size, dtype_name, checkpointing, keep_grads=True)
    dropped = _trace(workload, micro_batch_size, dtype_name, checkpointing, keep_grads=False)
    return kept.model_copy(
        update={"backward_peak_nograd_bytes": dropped.backward_peak_nograd_bytes}
    )


def _trace(
    workload: Workload,
    micro_batch_size: int,
    dtype_name: str,
    checkpointing: bool,
    *,
    keep_grads: bool,
) -> ActivationProfile:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autotune.memtrack import TensorMemoryTracker

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    previous = torch.get_default_dtype()
    with FakeTensorMode(), TensorMemoryTracker() as tracker:
        # Built in the target dtype: Module.to() cannot swap fake parameters in place.
        torch.set_default_dtype(dtype)
        try:
            model = workload.build_model()
        finally:
            torch.set_default_dtype(previous)
        if checkpointing:
            workload.enable_activation_checkpointing(model)
        model.train()
        first_grad: list[int] = []

        def on_grad(parameter: Any) -> None:
            if not first_grad:
                first_grad.append(tracker.live_bytes)
            if not keep_grads:
                parameter.grad = None

        for parameter in model.parameters():
            parameter.register_post_accumulate_grad_hook(on_grad)
        params_bytes = tracker.live_bytes
        batch = workload.make_batch(micro_batch_size, torch.device("cpu"))
        tracker.reset_peak()
        loss = workload.loss(model, batch)
        forward_peak = tracker.peak_bytes
        tracker.reset_peak()
        loss.backward()
        backward_peak = tracker.peak_bytes
    return ActivationProfile(
        forward_peak_bytes=forward_peak - params_bytes,
        backward_peak_bytes=backward_peak - params_bytes,
        backward_peak_nograd_bytes=backward_peak - params_bytes,
        at_first_grad_bytes=(first_grad[0] if first_grad else backward_peak) - params_bytes,
    )


@functools.lru_cache(maxsize=256)
def _cached(
    workload: Workload, micro_batch_size: int, dtype_name: str, checkpointing: bool
) -> ActivationProfile:
    layers = getattr(workload, "num_layers", None)
    with_layers = getattr(workload, "with_layers", None)
    if layers is None or with_layers is None or layers <= max(TRACE_LAYERS):
        return trace_once(workload, micro_batch_size, dtype_name, checkpointing)
    short, longer = TRACE_LAYERS
    a = trace_once(with_layers(short), micro_batch_size, dtype_name, checkpointing)
    b = trace_once(with_layers(longer), micro_batch_size, dtype_name, checkpointing)
    return _linear(short, a, longer, b, layers)


def profile(
    workload: Workload, micro_batch_size: int, precision: str, checkpointing: bool
) -> ActivationProfile:
    """The activation profile at any micro-batch, from traces at two micro-batches."""
    dtype_name = "fp32" if precision == "fp32" else "bf16"  # fp16 and bf16 have equal sizes
    m0, m1 = TRACE_MICRO_BATCHES
    if micro_batch_size in TRACE_MICRO_BATCHES:
        return _cached(workload, micro_batch_size, dtype_name, checkpointing)
    a = _cached(workload, m0, dtype_name, checkpointing)
    b = _cached(workload, m1, dtype_name, checkpointing)
    return _linear(m0, a, m1, b, micro_batch_size)
