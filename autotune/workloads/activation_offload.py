"""Activation offload: the saved activations of the blocks that are not recomputed kept in
host memory between forward and backward, and brought back when backward needs them.

torchtune's pattern (``torchtune.training.OffloadActivations``,
torchtune/training/_activation_offloading.py): a ``torch.autograd.graph.saved_tensors_hooks``
context whose pack hook copies each tensor autograd saves to the host and whose unpack hook
copies it back to the device it came from. Two kinds of saved tensor stay where they are,
as torchtune's: a parameter (or a view of one, such as the transpose a linear layer saves),
which the device holds anyway, so a copy would free nothing; and a tensor under
:data:`MIN_OFFLOAD_BYTES`, whose transfer costs more than it frees. That is what sets these
hooks apart from torch's built-in ``torch.autograd.graph.save_on_cpu``, which moves every
saved tensor, parameters included. A tensor saved by several ops (a DiT's conditioning,
which every block saves) is copied once per save, as torchtune's hooks copy it.

The copies run on the compute stream (torchtune's single-stream path): into pinned host
memory without blocking where the device is CUDA, so the device tensor is freed as soon as
the copy is queued and the copy back is ordered before the backward kernels that read it.
The hooks wrap only the blocks that are not recomputed: a recomputed block saves its input
alone (``torch.utils.checkpoint``'s own hooks take precedence inside it).

The host is a parameter: ``cpu`` in training; ``meta`` in the memory model's trace on fake
tensors, where a packed tensor leaves the device and holds no memory anywhere, and its
unpacking allocates it again, so the traced device peak is the one a GPU would see and the
:class:`OffloadLedger` counts the host bytes.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# The smallest saved tensor worth moving: torchtune's OffloadActivations(min_offload_size)
# default, in bytes.
MIN_OFFLOAD_BYTES = 1024


def pinned_bytes(nbytes: int) -> int:
    """The pinned host memory a copy of ``nbytes`` holds: torch's caching host allocator
    (``at::CachingHostAllocator``, ATen/core/CachingHostAllocator.h) rounds each request
    up to the next power of two."""
    return 1 << max(nbytes - 1, 0).bit_length()


@dataclass
class OffloadLedger:
    """What the pack hook did: tensors and bytes moved to the host (``packed_bytes``, what
    crosses the host link), the host memory they hold now and at most (pinned copies
    rounded as the host allocator rounds them), and the saved tensors it left on the
    device (parameters, small ones)."""

    packed: int = 0
    packed_bytes: int = 0
    host_bytes: int = 0
    peak_host_bytes: int = 0
    skipped_parameters: int = 0
    skipped_small: int = 0

    def _added(self, nbytes: int, held_bytes: int) -> None:
        self.packed += 1
        self.packed_bytes += nbytes
        self.host_bytes += held_bytes
        self.peak_host_bytes = max(self.peak_host_bytes, self.host_bytes)

    def _released(self, held_bytes: int) -> None:
        self.host_bytes -= held_bytes


class _Packed:
    """A saved tensor's host copy, the device it returns to, and whether the copy is
    pinned (its way back then does not block)."""

    __slots__ = ("__weakref__", "device", "host", "pinned")

    def __init__(self, host: Any, device: Any, pinned: bool) -> None:
        self.host = host
        self.device = device
        self.pinned = pinned


def is_parameter(tensor: Any) -> bool:
    """``tensor`` is a parameter or a view of one: an ``nn.Parameter``, a leaf that
    requires grad (what a sharding library may hand a layer in a parameter's place), or
    autocast's cast of one (``ToCopyBackward0`` straight from the parameter's gradient
    accumulator: the device holds it for the whole forward anyway)."""
    import torch

    base = tensor._base if tensor._base is not None else tensor
    if isinstance(base, torch.nn.Parameter) or (base.is_leaf and base.requires_grad):
        return True
    grad_fn = base.grad_fn
    return (
        grad_fn is not None
        and type(grad_fn).__name__ == "ToCopyBackward0"
        and any(type(fn).__name__ == "AccumulateGrad" for fn, _ in grad_fn.next_functions if fn)
    )


@contextmanager
def offload_saved_tensors(
    host: str = "cpu", ledger: OffloadLedger | None = None, min_bytes: int = MIN_OFFLOAD_BYTES
) -> Iterator[OffloadLedger]:
    """Under this context every tensor autograd saves that is not a parameter
    (:func:`is_parameter`) and holds at least ``min_bytes`` is kept on ``host`` until
    backward unpacks it back onto its own device; ``ledger`` (a new one by default) counts
    what moved."""
    import torch

    ledger = ledger if ledger is not None else OffloadLedger()

    def pack(tensor: Any) -> Any:
        if is_parameter(tensor):
            ledger.skipped_parameters += 1
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes < min_bytes:
            ledger.skipped_small += 1
            return tensor
        pinned = host == "cpu" and tensor.device.type == "cuda"
        copy = torch.empty_like(tensor, device=host, pin_memory=pinned)
        copy.copy_(tensor, non_blocking=pinned)
        packed = _Packed(copy, tensor.device, pinned)
        # a trace (host meta) stands for a GPU's pinned copies
        held = pinned_bytes(nbytes) if pinned or host == "meta" else nbytes
        ledger._added(nbytes, held)
        weakref.finalize(packed, ledger._released, held)
        return packed

    def unpack(saved: Any) -> Any:
        if not isinstance(saved, _Packed):
            return saved
        if saved.host.is_meta:  # a trace: the shape comes back, allocated on the device
            return torch.empty_like(saved.host, device=saved.device)
        return saved.host.to(saved.device, non_blocking=saved.pinned)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield ledger


def _offloaded_forward(
    forward: Any, host: str, ledger: OffloadLedger | None, *args: Any, **kwargs: Any
) -> Any:
    with offload_saved_tensors(host, ledger):
        return forward(*args, **kwargs)


def offload_blocks(
    blocks: Sequence[Any], host: str = "cpu", ledger: OffloadLedger | None = None
) -> None:
    """Run each of ``blocks``' forward under :func:`offload_saved_tensors` (patches the
    instances' ``forward``, as checkpointing does, so module hooks stay around it)."""
    for block in blocks:
        block.forward = functools.partial(_offloaded_forward, block.forward, host, ledger)


def apply_offload(workload: Any, model: Any, fraction: float, offload: str = "none") -> None:
    """Keep the saved activations of ``model``'s blocks that ``fraction`` does not recompute
    (the last ones: :func:`autotune.workloads.checkpointing.apply_checkpointing` recomputes
    the first) on ``offload`` (a candidate's ``activation_offload``: none, or ``cpu``)."""
    from autotune.workloads.checkpointing import checkpointed_block_count

    if offload == "none" or fraction >= 1:
        return
    blocks = workload.checkpoint_blocks(model)
    offload_blocks(blocks[checkpointed_block_count(fraction, len(blocks)) :], host=offload)
