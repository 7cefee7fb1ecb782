"""A CUDA rank's memory limit: PyTorch's allocator gets the limit less what lies outside it
(the CUDA context, NCCL's communicators and buffers, cuBLAS's handles), and DeepSpeed's
``available_memory()`` is made to see the limit instead of the card (ZeRO-1/2 decide there
where to flatten).

What lies outside the allocator is this process's: NVML's used memory of this PID less
``memory_reserved`` ("process"; the GPU found in NVML by its UUID, whatever
``CUDA_DEVICE_ORDER`` and ``CUDA_VISIBLE_DEVICES`` say); where NVML is not installed or does
not list the process (a container's own PID namespace, MIG), the device's total - free -
reserved ("device"), which also counts other processes on the GPU. One candidate
(:class:`CudaMemoryLimit`) reads it at its start, again after the engine's first optimizer
step (DeepSpeed's groups and ZeRO's all-gather/reduce-scatter have connected their
communicators by then), setting the limit again from it, and at its end; the largest
reading is left out of the limit and added to the reported peak. A warm rank's later
candidate that starts with more outside the allocator than the process's first candidate
of any backend held at most reports it (``overhead_left_bytes``).

Heavy imports (torch, deepspeed, pynvml) stay inside functions; pynvml (the nvidia-ml-py
package) is optional.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from autotune.probe._rank_memory import agreed_max
from autotune.protocol import OverheadMethod, ProbeSpec, RankReport

T = TypeVar("T")

# The largest memory outside the allocator that the process's first candidate of each
# backend measured, per (device, backend): what the communicators a backend makes once and
# keeps hold there at most (DeepSpeed's copy of the world group, reused by its later engines).
_FIRST_LARGEST_BYTES: dict[tuple[str, str], int] = {}


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


class CudaMemoryLimit:
    """One candidate's limit on CUDA and the memory outside the allocator it measured."""

    def __init__(self, spec: ProbeSpec, device: Any) -> None:
        self.spec = spec
        self.device = device
        self.at_start_bytes = 0
        self.largest_bytes = 0
        self.method: OverheadMethod = "none"
        self.stepped = False

    def start(self) -> int:
        """Connect what the process can (cuBLAS; NCCL once a process group exists), read
        what lies outside the allocator and set the limit from it; the reading."""
        connect_cuda(self.device)
        self.at_start_bytes = self.measure()
        self.apply()
        return self.at_start_bytes

    def update(self, *, connect: bool = False) -> None:
        """Read again and set the limit from the largest reading (a communicator made since
        is outside the allocator too)."""
        if connect:
            connect_cuda(self.device)
        self.measure()
        self.apply()

    def measure(self) -> int:
        overhead, method = cuda_overhead(self.device)
        self.largest_bytes = max(self.largest_bytes, overhead)
        # one device-wide reading makes the candidate's figure device-wide
        self.method = "device" if "device" in (self.method, method) else method
        return overhead

    def apply(self) -> None:
        """The caching allocator raises OutOfMemoryError at the limit less the largest
        overhead, as a card of the limit's size would; DeepSpeed's available memory sees
        the same budget."""
        import torch
        from deepspeed.accelerator import get_accelerator

        limit, overhead = self.spec.vram_limit_bytes, self.largest_bytes
        total = int(torch.cuda.get_device_properties(self.device).total_memory)
        fraction = allocator_fraction(limit, overhead, total)
        torch.cuda.set_per_process_memory_fraction(fraction, self.device)
        limit_available_memory(
            get_accelerator(),
            limit - overhead,
            lambda: int(torch.cuda.memory_reserved(self.device)),
        )

    def after_first_step(self, step: Callable[[], T]) -> Callable[[], T]:
        """``step``, reading again (and setting the limit again) after its first call."""

        def stepped() -> T:
            outcome = step()
            if not self.stepped:
                self.stepped = True
                self.update()
            return outcome

        return stepped

    def left_bytes(self) -> int:
        """Bytes outside the allocator at this candidate's start beyond the most that the
        process's first candidate of any backend measured (0 for the process's first):
        communicators and other memory earlier candidates left, the largest over the ranks
        (all must agree whether to go on). Measured against those candidates' largest, not
        their start: communicators a backend keeps and reuses across engines (DeepSpeed's
        copy of the world group) were inside its first candidate's peak. A warm rank whose
        first candidate was FSDP2's meets DeepSpeed's copy only in its first DeepSpeed
        candidate, and that is no leftover for the candidates after it."""
        device = str(self.device)
        firsts = [b for (where, _), b in _FIRST_LARGEST_BYTES.items() if where == device]
        left = max(0, self.at_start_bytes - max(firsts)) if firsts else 0
        return agreed_max(left, self.device)

    def finish(self, report: RankReport) -> None:
        """Read once more at the end and record the candidate's figures in ``report``."""
        self.measure()
        first_key = (str(self.device), self.spec.candidate.backend)
        _FIRST_LARGEST_BYTES.setdefault(first_key, self.largest_bytes)
        report.device_overhead_bytes = self.largest_bytes
        report.overhead_at_start_bytes = self.at_start_bytes
        report.overhead_method = self.method


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


def cuda_overhead(device: Any) -> tuple[int, OverheadMethod]:
    """Device memory this process holds outside PyTorch's allocator, and how it was read:
    NVML's figure for this process less ``memory_reserved``, else the device-wide one."""
    import torch

    torch.cuda.synchronize(device)
    reserved = int(torch.cuda.memory_reserved(device))
    used = process_used_bytes(device)
    if used is not None:
        return max(0, used - reserved), "process"
    free, total = torch.cuda.mem_get_info(device)
    return device_overhead_bytes(int(total), int(free), reserved), "device"


def process_used_bytes(device: Any) -> int | None:
    """NVML's used device memory of this process (nvidia-smi's per-process figure: the CUDA
    context, every cudaMalloc, the allocator's reserve included); None where pynvml is not
    installed, NVML fails or does not know the device, or does not list this PID or its
    figure (a container's own PID namespace, MIG)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = nvml_handle(pynvml, device)
        if handle is None:
            return None
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except (pynvml.NVMLError, RuntimeError):
        return None
    used = [p.usedGpuMemory for p in processes if p.pid == os.getpid()]
    if not used or any(figure is None for figure in used):
        return None
    return int(sum(used))


def nvml_handle(pynvml: Any, device: Any) -> Any:
    """NVML's handle of ``device``, found by the device's UUID: CUDA numbers the visible
    devices in ``CUDA_DEVICE_ORDER`` (fastest first unless it says ``PCI_BUS_ID``) after
    ``CUDA_VISIBLE_DEVICES``, NVML in PCI bus order, so an index read through one does not
    name the same GPU in the other. None where torch gives no UUID."""
    import torch

    uuid = str(getattr(torch.cuda.get_device_properties(device), "uuid", "") or "")
    if not uuid:
        return None
    # torch prints the 16 bytes as 8-4-4-4-12 hex digits (torch/csrc/cuda/Module.cpp,
    # _CUuuid.__str__); NVML names the GPU "GPU-" and those digits (nvmlDeviceGetUUID)
    name = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    return pynvml.nvmlDeviceGetHandleByUUID(name.encode())
