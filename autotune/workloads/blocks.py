"""A model's transformer blocks: the units FSDP2 shards one at a time (torchtitan applies
``fully_shard`` per block), the memory model sizes its gathered parameters by, and
activation checkpointing recomputes one at a time."""

from __future__ import annotations

from typing import Any


def block_units(model: Any) -> list[Any]:
    """The modules whose class the model names as not to be split (``_no_split_modules``,
    as transformers and accelerate's FSDP auto-wrap read it), else the entries of its
    largest ``ModuleList``; none when it has neither."""
    import torch

    names = set(getattr(model, "_no_split_modules", None) or ())
    units = [m for m in model.modules() if type(m).__name__ in names]
    if units:
        return units
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        return []
    largest = max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))
    return list(largest)


def shard_units(workload: Any, model: Any) -> list[Any]:
    """The modules FSDP2 shards one unit each, inner ones first: the workload's own
    (``Workload.shard_units``: a DiT's timestep embedding, which its model calls from
    outside the block that holds it, is a unit of its own), else the blocks."""
    own = getattr(workload, "shard_units", None)
    return list(own(model)) if callable(own) else block_units(model)


def block_params(units: list[Any]) -> tuple[int, int]:
    """(parameters in all ``units``, in the largest), each tensor counted once, in the unit
    that holds it innermost (units are listed inner first)."""
    seen: set[int] = set()
    sizes = []
    for unit in units:
        size = 0
        for param in unit.parameters():
            if id(param) not in seen:
                seen.add(id(param))
                size += param.numel()
        sizes.append(size)
    return sum(sizes), max(sizes, default=0)


def partial_checkpointing_blocks(workload: Any) -> int | None:
    """How many blocks a ``checkpoint_fraction`` counts its share of for ``workload`` (its
    :meth:`~autotune.workloads.Workload.checkpoint_blocks` of the model built on the meta
    device); None where the workload recomputes all blocks or none only (its
    ``enable_activation_checkpointing`` takes no ``blocks``) or has no blocks."""
    import inspect

    import torch

    method = getattr(workload, "enable_activation_checkpointing", None)
    if method is None or "blocks" not in inspect.signature(method).parameters:
        return None
    with torch.device("meta"):
        model = workload.build_model()
    return len(workload.checkpoint_blocks(model)) or None


def checkpointed_block_count(fraction: float, blocks: int) -> int:
    """The blocks of ``blocks`` a checkpoint fraction recomputes: the nearest whole number,
    halves rounded up (a fraction above 0 recomputes at least one where ``blocks`` allows)."""
    count = min(blocks, int(fraction * blocks + 0.5))
    return max(count, 1) if fraction > 0 and blocks else count


def checkpoint_leading_blocks(blocks: list[Any], count: int) -> None:
    """Recompute the activations of the first ``count`` of ``blocks`` (in forward order)
    during backward: each one's forward runs under ``torch.utils.checkpoint`` without
    reentrancy, which ZeRO-3's parameter hooks and FSDP2's unsharding need. The first
    blocks, so that backward starts on kept ones: by the time it reaches a recomputed
    block, the kept blocks' activations have been freed. Patches the instances'
    ``forward`` (the module's hooks, FSDP2's ``fully_shard`` among them, stay around it, as
    torchtitan wraps a block before it shards the wrapper)."""
    import functools

    from torch.utils.checkpoint import checkpoint

    for block in blocks[:count]:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def apply_checkpointing(workload: Any, model: Any, fraction: float) -> None:
    """Recompute ``fraction`` of ``model``'s blocks in backward, as a candidate's
    ``checkpoint_fraction`` says: none at 0, every block at 1 (the workload's own switch),
    else the first ones, counted by :func:`checkpointed_block_count`."""
    if fraction <= 0:
        return
    if fraction >= 1:
        workload.enable_activation_checkpointing(model)
        return
    count = checkpointed_block_count(fraction, len(workload.checkpoint_blocks(model)))
    workload.enable_activation_checkpointing(model, blocks=count)
