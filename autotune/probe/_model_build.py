"""How a probe rank builds the workload's model, as production builds it for the candidate,
and its batches, in the engine's dtype.

Where the backend builds it sharded, no rank ever holds the whole model: DeepSpeed's ZeRO-3
partitions (and casts to the config's dtype) each parameter as its module is constructed,
under ``deepspeed.zero.Init``; FSDP2 builds the parameters on the meta device, and its
engine gives each rank memory for its shards only, after ``fully_shard``. Otherwise it is
built on the device in the target dtype, as DeepSpeed would hold it after ``initialize``.
Heavy imports stay inside functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from autotune.protocol import BuildInfo, ProbeSpec

if TYPE_CHECKING:
    from autotune.backends import TrainingBackend

# Workloads whose model code this process has imported (see _import_model_code).
_IMPORTED_WORKLOADS: set[str] = set()


def build_model(
    workload: Any, spec: ProbeSpec, device: Any, backend: TrainingBackend
) -> tuple[Any, BuildInfo]:
    """The workload's model as production builds it for this candidate, recomputing the
    blocks the candidate recomputes and offloading the saved activations of the others
    where it offloads them.

    Where the backend builds it sharded (DeepSpeed's ZeRO-3 under ``deepspeed.zero.Init``,
    FSDP2 with its parameters on the meta device) no rank ever holds the whole model (a 7B
    model would otherwise need ~28 GB per rank). Otherwise it is built on the device in the
    target dtype, as DeepSpeed would hold it after ``initialize``.
    """
    sharded = backend.sharded_build(spec.candidate, spec.backend_config)
    if sharded is not None:
        _import_model_code(workload, spec.workload)
        with sharded:
            model = workload.build_model()
    else:
        held_in = backend.parameter_precision(spec.candidate)
        with device, _default_dtype(_target_dtype(held_in)):
            model = workload.build_model()
    from autotune.workloads.activation_offload import apply_offload
    from autotune.workloads.checkpointing import apply_checkpointing

    candidate = spec.candidate
    apply_checkpointing(workload, model, candidate.checkpoint_fraction, candidate.checkpoint_policy)
    apply_offload(workload, model, candidate.checkpoint_fraction, candidate.activation_offload)
    return model, _build_info(model, sharded is not None)


def _import_model_code(workload: Any, ref: str) -> None:
    """Build the model once on the meta device (no memory), outside ``zero.Init``, so that
    what its code imports lazily (transformers' model modules, and through them
    ``torch._dynamo``) is imported before ``zero.Init`` patches torch's tensor constructors:
    importing ``torch._dynamo`` under that patch fails ("Duplicate dispatch rule")."""
    import torch

    if ref in _IMPORTED_WORKLOADS:
        return
    with torch.device("meta"):
        workload.build_model()
    _IMPORTED_WORKLOADS.add(ref)


def _build_info(model: Any, sharded: bool) -> BuildInfo:
    """What the build left: under ``zero.Init`` every parameter is a partition; a
    parameter on the meta device holds no memory."""
    params = list(model.parameters())
    partitioned = bool(params) and all(hasattr(p, "ds_numel") for p in params)
    held = [p.ds_tensor if partitioned else p for p in params]
    storages = {
        t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in held if not t.is_meta
    }
    floating = next((t for t in held if t.is_floating_point()), None)
    return BuildInfo(
        zero_init=sharded and partitioned,
        device=str(held[0].device) if held else "",
        dtype=str(floating.dtype).removeprefix("torch.") if floating is not None else "",
        partitioned=partitioned,
        param_bytes=sum(storages.values()),
        model_param_count=sum(int(p.ds_numel if partitioned else p.numel()) for p in params),
    )


def make_batch(workload: Any, micro_batch_size: int, device: Any, precision: str) -> Any:
    """The workload's batch with its inputs in the engine's dtype: a ``make_batch`` that
    takes ``dtype`` is told it (and decides); another has its floating-point tensors cast
    (an fp32 input to a bf16 model fails: "mat1 and mat2 must have the same dtype")."""
    import inspect

    dtype = _target_dtype(precision)
    if "dtype" in inspect.signature(workload.make_batch).parameters:
        return workload.make_batch(micro_batch_size, device, dtype=dtype)
    return _cast_floating(workload.make_batch(micro_batch_size, device), dtype)


def _cast_floating(batch: Any, dtype: Any) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(dtype) if batch.is_floating_point() else batch
    if isinstance(batch, dict):
        return {key: _cast_floating(value, dtype) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_cast_floating(value, dtype) for value in batch)
    return batch


@contextlib.contextmanager
def _default_dtype(dtype: Any) -> Iterator[None]:
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _target_dtype(precision: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
