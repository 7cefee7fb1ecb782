"""A CUDA rank's memory limit: PyTorch's allocator gets the limit less what lies outside it
(the CUDA context, NCCL's buffers, cuBLAS's workspace), and DeepSpeed's
``available_memory()`` is made to see the limit instead of the card (ZeRO-1/2 decide there
where to flatten).

Heavy imports (torch, deepspeed) stay inside functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune.protocol import ProbeSpec


def allocator_fraction(limit_bytes: int, overhead_bytes: int, total_bytes: int) -> float:
    """The share of the device PyTorch's caching allocator may hold: the limit less what the
    CUDA context, NCCL and cuBLAS hold outside it, as a card of ``limit_bytes`` would have."""
    return min(1.0, max(0, limit_bytes - overhead_bytes) / total_bytes)


def device_overhead_bytes(total_bytes: int, free_bytes: int, reserved_bytes: int) -> int:
    """Device memory in use that PyTorch's allocator does not hold (``mem_get_info``'s total
    less free less ``memory_reserved``): the CUDA context, NCCL buffers, cuBLAS workspaces."""
    return max(0, total_bytes - free_bytes - reserved_bytes)


def limited_available_memory(free_bytes: int, budget_bytes: int, reserved_bytes: int) -> int:
    """What DeepSpeed should believe is free: the device's free memory, but no more than the
    allocator's budget less what it already holds."""
    return max(0, min(free_bytes, budget_bytes - reserved_bytes))


def limit_available_memory(
    accelerator: Any, budget_bytes: int, reserved_bytes: Callable[[], int]
) -> None:
    """Make DeepSpeed's ``accelerator.available_memory()`` see the limit, not the card.

    ZeRO-1/2 flattens its parameter groups on the device when ``available_memory`` (NVML's
    free memory on CUDA) says the copy fits; a large card probing a small limit would
    flatten where a card of that size could not. Calling it again replaces the limit.
    """
    original = getattr(accelerator, "_autotune_available_memory", None)
    if original is None:
        original = accelerator.available_memory
        accelerator._autotune_available_memory = original

    def available_memory(device_index: Any = None) -> int:
        return limited_available_memory(int(original(device_index)), budget_bytes, reserved_bytes())

    accelerator.available_memory = available_memory


def limit_cuda_memory(spec: ProbeSpec, device: Any) -> int:
    """Put the rank under ``spec.vram_limit_bytes`` as a card of that size would be; return
    the memory outside PyTorch's allocator (context, NCCL, cuBLAS) the limit had to cover."""
    import torch
    from deepspeed.accelerator import get_accelerator

    connect_cuda(device)
    overhead = cuda_overhead_bytes(device)
    total = int(torch.cuda.get_device_properties(device).total_memory)
    # The caching allocator raises OutOfMemoryError at the limit, as a smaller GPU would.
    fraction = allocator_fraction(spec.vram_limit_bytes, overhead, total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    limit_available_memory(
        get_accelerator(),
        spec.vram_limit_bytes - overhead,
        lambda: int(torch.cuda.memory_reserved(device)),
    )
    return overhead


def connect_cuda(device: Any) -> None:
    """Make what a training process carries outside the allocator: the first matmul creates
    cuBLAS's handle and workspace, the first collective (once a process group of several
    ranks exists) NCCL's communicator and buffers."""
    import torch
    import torch.distributed as dist

    probe = torch.ones(8, 8, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(probe)
    probe = probe @ probe
    del probe


def cuda_overhead_bytes(device: Any) -> int:
    import torch

    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    return device_overhead_bytes(int(total), int(free), int(torch.cuda.memory_reserved(device)))
