"""A fake of the CUDA calls a probe rank's memory accounting makes, for CPU tests: a CPU
build of torch cannot make them (tests/integration/test_gpu_paths.py makes the real ones on
a GPU). :class:`FakeCudaMemory` keeps one device's numbers and the test moves them as a GPU's
would move; ``install`` patches it in for torch's calls and for NVML's (``pynvml``)."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import pytest
import torch

MiB = 2**20
FAKE_GPU_UUID = "fa4e0000-0000-0000-0000-000000000000"  # as str(torch's device uuid) prints


class FakeCudaMemory:
    """Stands for ``torch.cuda``'s allocator statistics (``memory_allocated``,
    ``memory_reserved``, ``max_memory_allocated``, ``max_memory_reserved``,
    ``reset_peak_memory_stats``), the device's memory (``mem_get_info``,
    ``get_device_properties``), the allocator's limit (``set_per_process_memory_fraction``,
    enforced on :meth:`allocate` as the caching allocator does), ``set_device``,
    ``synchronize``, ``get_device_name``, the first matmul and collective of a rank
    (:meth:`connect`: cuBLAS's handle, NCCL's communicator), and NVML's per-process used
    memory (``pynvml.nvmlDeviceGetComputeRunningProcesses``).

    ``outside_bytes`` is what this process holds outside the allocator (CUDA context, cuBLAS,
    NCCL); ``other_process_bytes`` what another process on the same GPU holds."""

    def __init__(
        self,
        total_bytes: int,
        context_bytes: int,
        *,
        other_process_bytes: int = 0,
        communicator_bytes: int = 0,
    ) -> None:
        self.total_bytes = total_bytes
        self.outside_bytes = context_bytes
        self.other_process_bytes = other_process_bytes
        self.communicator_bytes = communicator_bytes  # what connect() adds, once
        self.allocated_bytes = self.reserved_bytes = 0
        self.peak_allocated_bytes = self.peak_reserved_bytes = 0
        self.fraction: float | None = None
        self.events: list[str] = []
        self.connected = False
        self.nvml_lists_this_process = True  # False: NVML sees other PIDs (a container's)

    # -- what the test moves ----------------------------------------------------------------
    def allocate(self, nbytes: int) -> None:
        """Tensors of ``nbytes`` made on the device: reserved grows with them, up to the
        fraction's share of the device (then OutOfMemoryError, as the caching allocator)."""
        reserved = max(self.reserved_bytes, self.allocated_bytes + nbytes)
        if self.fraction is not None and reserved > self.fraction * self.total_bytes:
            raise torch.OutOfMemoryError("CUDA out of memory (FakeCudaMemory's limit)")
        self.allocated_bytes += nbytes
        self.reserved_bytes = reserved
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)

    def free(self, nbytes: int) -> None:
        self.allocated_bytes -= nbytes

    def connect(self, device: Any) -> None:
        self.events.append("connect")
        if not self.connected:
            self.connected = True
            self.outside_bytes += self.communicator_bytes

    # -- torch.cuda -------------------------------------------------------------------------
    def memory_allocated(self, device: Any = None) -> int:
        return self.allocated_bytes

    def memory_reserved(self, device: Any = None) -> int:
        return self.reserved_bytes

    def max_memory_allocated(self, device: Any = None) -> int:
        return self.peak_allocated_bytes

    def max_memory_reserved(self, device: Any = None) -> int:
        return self.peak_reserved_bytes

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.events.append("reset_peak_memory_stats")
        self.peak_allocated_bytes = self.allocated_bytes
        self.peak_reserved_bytes = self.reserved_bytes

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        used = self.reserved_bytes + self.outside_bytes + self.other_process_bytes
        return self.total_bytes - used, self.total_bytes

    def get_device_properties(self, device: Any = None) -> Any:
        return types.SimpleNamespace(
            total_memory=self.total_bytes, name="FakeCudaMemory GPU", uuid=FAKE_GPU_UUID
        )

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        assert isinstance(fraction, float) and 0 <= fraction <= 1  # torch's own checks
        self.events.append("set_per_process_memory_fraction")
        self.fraction = fraction

    def get_per_process_memory_fraction(self, device: Any = None) -> float:
        return 1.0 if self.fraction is None else self.fraction

    def nothing(self, *args: Any, **kwargs: Any) -> None:
        """``set_device`` and ``synchronize``: nothing to do on a fake device."""

    # -- NVML -------------------------------------------------------------------------------
    def nvml_module(self) -> types.ModuleType:
        """A ``pynvml`` whose compute processes are this one (its allocator's reserve and
        what lies outside it) and, when there is one, another process on the GPU."""
        module = types.ModuleType("pynvml")

        class NVMLError(Exception):
            pass

        def processes(handle: Any) -> list[Any]:
            mine = types.SimpleNamespace(
                pid=os.getpid(), usedGpuMemory=self.reserved_bytes + self.outside_bytes
            )
            other = types.SimpleNamespace(pid=1, usedGpuMemory=self.other_process_bytes)
            if not self.nvml_lists_this_process:
                mine.pid = os.getpid() + 1
            return [other, mine] if self.other_process_bytes else [mine]

        module.NVMLError = NVMLError  # type: ignore[attr-defined]
        module.nvmlInit = lambda: None  # type: ignore[attr-defined]
        module.nvmlDeviceGetHandleByUUID = lambda uuid: ("handle", uuid)  # type: ignore[attr-defined]
        module.nvmlDeviceGetComputeRunningProcesses = processes  # type: ignore[attr-defined]
        return module

    def install(self, monkeypatch: pytest.MonkeyPatch, *, nvml: bool) -> None:
        """Patch the fake in; ``nvml`` False: ``import pynvml`` fails, as where the
        nvidia-ml-py package is not installed."""
        from autotune.probe import _cuda_memory as cuda_memory

        for name in (
            "memory_allocated",
            "memory_reserved",
            "max_memory_allocated",
            "max_memory_reserved",
            "reset_peak_memory_stats",
            "mem_get_info",
            "get_device_properties",
            "set_per_process_memory_fraction",
            "get_per_process_memory_fraction",
        ):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        for name in ("set_device", "synchronize"):
            monkeypatch.setattr(torch.cuda, name, self.nothing)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "FakeCudaMemory")
        monkeypatch.setattr(cuda_memory, "connect_cuda", self.connect)
        monkeypatch.setitem(sys.modules, "pynvml", self.nvml_module() if nvml else None)
        # the limit replaces DeepSpeed's accelerator's available_memory: put it back after
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        monkeypatch.setattr(accelerator, "available_memory", accelerator.available_memory)
        monkeypatch.setattr(accelerator, "_autotune_available_memory", None, raising=False)
