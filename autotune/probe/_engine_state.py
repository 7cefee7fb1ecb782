"""What a rank reads of its engine's optimizer after the timed steps, so that a report says
what the engine did rather than what its config asked for: the optimizer that stepped,
the fp16 loss scale its scaler held, and where an offloaded optimizer's host tensors live
(page-locked or not).

Heavy imports (torch) stay inside functions.
"""

from __future__ import annotations

from typing import Any


def stepping_optimizer(engine: Any) -> Any:
    """The optimizer that updates the weights: the one DeepSpeed's wrappers (fp16, ZeRO)
    hold as ``.optimizer``, or the engine's own where nothing wraps it (None without one)."""
    optimizer = getattr(engine, "optimizer", None)
    inner = getattr(optimizer, "optimizer", None)
    return inner if inner is not None and hasattr(inner, "param_groups") else optimizer


def optimizer_name(engine: Any) -> str:
    """``module.Class`` of the optimizer that steps (``torch.optim.adamw.AdamW``,
    ``deepspeed.ops.adam.fused_adam.FusedAdam`` ...); '' without one."""
    optimizer = stepping_optimizer(engine)
    if optimizer is None:
        return ""
    kind = type(optimizer)
    return f"{kind.__module__}.{kind.__qualname__}"


def loss_scale(engine: Any) -> float:
    """The loss scale the engine's fp16 scaler holds now (DeepSpeed keeps it as
    ``loss_scale_config.cur_scale`` or ``cur_scale`` on its fp16 and ZeRO optimizers);
    0.0 where the engine does not train in fp16 or holds no scaler."""
    fp16_enabled = getattr(engine, "fp16_enabled", None)
    if fp16_enabled is None or not fp16_enabled():
        return 0.0
    optimizer = getattr(engine, "optimizer", None)
    config = getattr(optimizer, "loss_scale_config", None)
    scale = getattr(config, "cur_scale", None) if config is not None else None
    if scale is None:
        scale = getattr(optimizer, "cur_scale", None)
    return float(scale) if scale is not None else 0.0


def host_tensor_bytes(optimizer: Any) -> tuple[int, int]:
    """(page-locked, pageable) bytes of the host (CPU) tensors ``optimizer`` steps: its
    parameters (an offloaded optimizer's fp32 partitions), their gradients and its states,
    each storage once. (0, 0) when it holds none on the host."""
    import torch

    if optimizer is None:
        return 0, 0
    seen: set[int] = set()
    pinned = pageable = 0
    for tensor in _tensors(optimizer):
        if hasattr(tensor, "to_local"):  # a DTensor (FSDP2): this rank's shard
            tensor = tensor.to_local()
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            continue
        storage = tensor.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        if _is_pinned(tensor):
            pinned += storage.nbytes()
        else:
            pageable += storage.nbytes()
    return pinned, pageable


def _tensors(optimizer: Any) -> list[Any]:
    found = []
    for group in getattr(optimizer, "param_groups", []):
        for param in group.get("params", []):
            found += [param, getattr(param, "grad", None)]
    for state in getattr(optimizer, "state", {}).values():
        if isinstance(state, dict):
            found += list(state.values())
    return found


def _is_pinned(tensor: Any) -> bool:
    """``Tensor.is_pinned()``; False where torch cannot tell (no CUDA to ask)."""
    try:
        return bool(tensor.is_pinned())
    except RuntimeError:
        return False
