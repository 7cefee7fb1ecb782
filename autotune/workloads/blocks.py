"""A model's transformer blocks: the units FSDP2 shards one at a time (torchtitan applies
``fully_shard`` per block) and the memory model sizes its gathered parameters by."""

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
