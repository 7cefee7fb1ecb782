"""Activation checkpointing of a model's blocks: how many of them a share recomputes,
which (the first ones), and how (every op again, or the selective policy that keeps the
matmul and attention outputs).

The first k blocks, so that backward starts on kept blocks, whose activations are freed
before the first recomputation: a lower peak than recomputing the last k (measured on
traces, benchmarks/RESULTS.md "Which blocks a share recomputes"). Each block's forward runs
under ``torch.utils.checkpoint`` without reentrancy, which ZeRO-3's parameter hooks and
FSDP2's unsharding need; the module's hooks, FSDP2's ``fully_shard`` among them, stay
around it, as torchtitan wraps a block before it shards the wrapper.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

# What the selective policy keeps of a recomputed block (the rest is recomputed): the
# outputs of matmuls and attention, the ops whose recomputation costs FLOPs; torchtitan's
# op-level list (torchtitan/distributed/activation_checkpoint.py, _save_list) with the
# matmul forms transformers' Conv1D and batched attention reach (addmm, bmm) and the CPU's
# attention kernel.
SELECTIVE_SAVED_OPS = (
    "mm.default",
    "addmm.default",
    "bmm.default",
    "_scaled_dot_product_efficient_attention.default",
    "_scaled_dot_product_flash_attention.default",
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "_scaled_dot_product_cudnn_attention.default",
)


def takes(workload: Any, parameter: str) -> bool:
    """The workload's ``enable_activation_checkpointing`` takes ``parameter`` (``blocks``:
    it recomputes a share of its blocks; ``policy``: it recomputes selectively)."""
    method = getattr(workload, "enable_activation_checkpointing", None)
    return method is not None and parameter in inspect.signature(method).parameters


@functools.lru_cache(maxsize=32)
def block_count(workload: Any) -> int:
    """How many :meth:`~autotune.workloads.Workload.checkpoint_blocks` ``workload``'s model
    has (built on the meta device): the blocks a share is counted in and the kept ones
    offloaded. Once per workload and process: resolving a run, binding its space and
    tracing ask it."""
    import torch

    with torch.device("meta"):
        model = workload.build_model()
    return len(workload.checkpoint_blocks(model))


def partial_checkpointing_blocks(workload: Any) -> int | None:
    """How many blocks a ``checkpoint_fraction`` counts its share of for ``workload``; None
    where the workload recomputes all blocks or none only (its
    ``enable_activation_checkpointing`` takes no ``blocks``) or has no blocks."""
    if not takes(workload, "blocks"):
        return None
    return block_count(workload) or None


def checkpointed_block_count(fraction: float, blocks: int) -> int:
    """The blocks of ``blocks`` a checkpoint fraction recomputes: the nearest whole number,
    halves rounded up (a fraction above 0 recomputes at least one where ``blocks`` allows)."""
    count = min(blocks, int(fraction * blocks + 0.5))
    return max(count, 1) if fraction > 0 and blocks else count


def selective_context() -> Callable[[], Any]:
    """``torch.utils.checkpoint``'s ``context_fn`` of the selective policy: the outputs of
    :data:`SELECTIVE_SAVED_OPS` are kept, every other op of the block is recomputed."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    saved = set()
    for name in SELECTIVE_SAVED_OPS:
        packet, _, overload = name.partition(".")
        op = getattr(torch.ops.aten, packet, None)
        if op is not None and hasattr(op, overload):
            saved.add(getattr(op, overload))

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        del ctx, args, kwargs
        if op in saved:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


def checkpoint_options(policy: str) -> dict[str, Any]:
    """The keyword arguments of ``torch.utils.checkpoint.checkpoint`` for ``policy``."""
    options: dict[str, Any] = {"use_reentrant": False}
    if policy == "selective":
        options["context_fn"] = selective_context()
    return options


def checkpoint_leading_blocks(blocks: list[Any], count: int, policy: str = "full") -> None:
    """Recompute the activations of the first ``count`` of ``blocks`` (in forward order)
    during backward, every op again or selectively (``policy``): each one's forward runs
    under ``torch.utils.checkpoint``; patches the instances' ``forward``."""
    from torch.utils.checkpoint import checkpoint

    options = checkpoint_options(policy)
    for block in blocks[:count]:
        block.forward = functools.partial(checkpoint, block.forward, **options)


def recompute(workload: Any, model: Any, blocks: int | None, policy: str = "full") -> None:
    """Call the workload's switch for every block (``blocks`` None) or the first ``blocks``,
    passing ``policy`` only where it is not full (a workload's switch may take none)."""
    options: dict[str, Any] = {"policy": policy} if policy != "full" else {}
    if blocks is not None:
        options["blocks"] = blocks
    workload.enable_activation_checkpointing(model, **options)


def apply_checkpointing(workload: Any, model: Any, fraction: float, policy: str = "full") -> None:
    """Recompute ``fraction`` of ``model``'s blocks in backward with ``policy``, as a
    candidate's ``checkpoint_fraction`` and ``checkpoint_policy`` say: none at 0, every
    block at 1 (the workload's own switch), else the first ones, counted by
    :func:`checkpointed_block_count`."""
    if fraction <= 0:
        return
    if fraction >= 1:
        recompute(workload, model, None, policy)
        return
    count = checkpointed_block_count(fraction, len(workload.checkpoint_blocks(model)))
    recompute(workload, model, count, policy)
