"""What the machine offers: CUDA GPUs and their memory, precision support, CPU fallback.

With no CUDA GPU, autotune runs each "GPU" as a CPU rank with DeepSpeed's CPU accelerator
over gloo. The memory limit then applies to the tensor bytes each rank tracks (see
:mod:`autotune.probe._memtrack`), and ``--vram auto`` means this machine's RAM divided by the ranks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune.errors import HardwareError

Accelerator = Literal["cuda", "cpu"]
PRECISIONS = ("fp32", "bf16", "fp16")


class Hardware(BaseModel):
    """A snapshot of the devices one node offers to probes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    accelerator: Accelerator = Field(description="'cuda' or 'cpu' (DeepSpeed CPU accelerator).")
    device_count: int = Field(description="CUDA devices visible; CPU cores when accelerator=cpu.")
    device_name: str = Field(description="Model name of device 0, or the CPU's.")
    device_memory_bytes: int = Field(description="Memory of one device; host RAM on CPU.")
    host_memory_bytes: int = Field(description="Physical RAM of this machine.")
    cpu_count: int = Field(description="CPU cores available to this process.")
    precisions: tuple[str, ...] = Field(description="Precisions DeepSpeed accepts here.")
    devices_per_node: int | None = Field(
        default=None,
        description="Devices of the largest node when probes run on a Ray cluster (then "
        "device_count is the cluster's); None: one machine, device_count.",
    )

    @property
    def node_devices(self) -> int:
        """Devices one node offers: what its host RAM, cores and links are shared by."""
        return self.devices_per_node or self.device_count

    def ranks_on_node(self, ranks: int) -> int:
        """Of ``ranks`` ranks, how many share one node (its RAM and cores)."""
        return max(1, min(ranks, self.node_devices))

    def nodes_spanned(self, ranks: int) -> int:
        """Nodes a probe of ``ranks`` ranks spans, packed onto the fewest."""
        return max(1, -(-ranks // self.node_devices))

    def default_vram_limit_bytes(self, ranks: int) -> int:
        """``--vram auto``: a device's memory, or on CPU the RAM shared by a node's ranks."""
        if self.accelerator == "cuda":
            return self.device_memory_bytes
        return self.host_memory_bytes // self.ranks_on_node(ranks)

    def check_ranks(self, gpus: int) -> None:
        """Refuse more devices (or CPU ranks) than the machine has."""
        if self.accelerator == "cuda" and gpus > self.device_count:
            raise HardwareError(
                f"--gpus {gpus}: only {self.device_count} CUDA GPU(s) are visible "
                f"({self.device_name}); pass --gpus {self.device_count} or fewer"
            )
        if self.accelerator == "cpu" and gpus > self.cpu_count:
            raise HardwareError(
                f"--gpus {gpus}: no CUDA GPU here, and {gpus} CPU ranks would oversubscribe the "
                f"{self.cpu_count} CPU cores; pass --gpus {self.cpu_count} or fewer"
            )

    def threads_per_rank(self, ranks: int) -> int:
        """Intra-op threads a rank gets in production: a node's cores split evenly among
        the ranks on that node."""
        return max(1, self.cpu_count // self.ranks_on_node(ranks))

    def describe(
        self, ranks: int, libraries: Iterable[str] = ("DeepSpeed's CPU accelerator",)
    ) -> str:
        """One line for the user, e.g. for the start of ``autotune run``; on CPU it names
        the ``libraries`` that train on the ranks (the space's backends')."""
        if self.accelerator == "cuda":
            return (
                f"{ranks} of {self.device_count} CUDA GPU(s) ({self.device_name}, "
                f"{self.device_memory_bytes / 2**30:.0f} GiB each); precisions "
                f"{', '.join(self.precisions)}"
            )
        return (
            f"no CUDA GPU: running {ranks} CPU rank(s) with {' or '.join(libraries)} "
            f"(gloo, {self.threads_per_rank(ranks)} thread(s) each); the memory limit applies "
            f"to each rank's tracked tensor bytes; precisions {', '.join(self.precisions)}"
        )


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_name() -> str:
    """This machine's CPU model, as /proc/cpuinfo names it ("CPU" where it does not)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


def detect() -> Hardware:
    """Ask torch for CUDA devices and DeepSpeed's accelerator for the precisions it accepts.

    Imports torch and deepspeed, so callers use it at run time, never at CLI import.
    """
    import psutil
    import torch

    host_memory_bytes = int(psutil.virtual_memory().total)
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        props = torch.cuda.get_device_properties(0)
        precisions = ["fp32", "fp16"]  # every CUDA GPU DeepSpeed supports has fp16
        if torch.cuda.is_bf16_supported(including_emulation=False):
            precisions.insert(1, "bf16")
        return Hardware(
            accelerator="cuda",
            device_count=torch.cuda.device_count(),
            device_name=props.name,
            device_memory_bytes=int(props.total_memory),
            host_memory_bytes=host_memory_bytes,
            cpu_count=_cpu_count(),
            precisions=tuple(precisions),
        )
    return Hardware(
        accelerator="cpu",
        device_count=_cpu_count(),
        device_name=cpu_name(),
        device_memory_bytes=host_memory_bytes,
        host_memory_bytes=host_memory_bytes,
        cpu_count=_cpu_count(),
        precisions=_cpu_precisions(),
    )


def _cpu_precisions() -> tuple[str, ...]:
    """Precisions DeepSpeed's CPU accelerator accepts (fp16 only where oneDNN has it)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import torch
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
    except ImportError as exc:  # pragma: no cover - deepspeed is a dependency
        raise HardwareError(f"cannot import DeepSpeed ({exc}); pip install deepspeed") from None
    accelerator = CPU_Accelerator()
    supported = set(accelerator.supported_dtypes())
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    return tuple(name for dtype, name in names.items() if dtype in supported)
