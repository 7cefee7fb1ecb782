"""What the machine offers: CUDA GPUs and their memory, precision support, CPU fallback.

With no CUDA GPU, autotune runs each "GPU" as a CPU rank with DeepSpeed's CPU accelerator
over gloo. The memory limit then applies to the tensor bytes each rank tracks (see
:mod:`autotune.memtrack`), and ``--vram auto`` means this machine's RAM divided by the ranks.
"""

from __future__ import annotations

import os
import threading
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

    def default_vram_limit_bytes(self, ranks: int) -> int:
        """``--vram auto``: a device's memory, or on CPU the RAM shared by all ranks."""
        if self.accelerator == "cuda":
            return self.device_memory_bytes
        return self.host_memory_bytes // max(ranks, 1)

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

    def threads_per_rank(self, ranks_on_node: int) -> int:
        """Intra-op threads a rank gets in production: the node's cores split evenly."""
        return max(1, self.cpu_count // max(ranks_on_node, 1))

    def describe(self, ranks: int) -> str:
        """One line for the user, e.g. for the start of ``autotune run``."""
        if self.accelerator == "cuda":
            return (
                f"{ranks} of {self.device_count} CUDA GPU(s) ({self.device_name}, "
                f"{self.device_memory_bytes / 2**30:.0f} GiB each); precisions "
                f"{', '.join(self.precisions)}"
            )
        return (
            f"no CUDA GPU: running {ranks} CPU rank(s) with DeepSpeed's CPU accelerator "
            f"(gloo, {self.threads_per_rank(ranks)} thread(s) each); the memory limit applies "
            f"to each rank's tracked tensor bytes; precisions {', '.join(self.precisions)}"
        )


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_name() -> str:
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
        device_name=_cpu_name(),
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


# A build older than this that still holds its lock was killed mid-compile (torch's
# FileBaton then waits forever); compiling one DeepSpeed op takes about a minute here.
STALE_BUILD_LOCK_S = 15 * 60


def torch_extensions_dir() -> str:
    """Where torch JIT-builds DeepSpeed's ops: one folder per Python environment and
    torch/DeepSpeed versions, so that two virtual environments never rebuild each other's
    ops (torch keeps a single folder per op and rebuilds when the build flags differ)."""
    import hashlib
    import sys
    from importlib.metadata import PackageNotFoundError, version

    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.environ["TORCH_EXTENSIONS_DIR"]
    try:
        versions = f"{version('torch')}-{version('deepspeed')}"
    except PackageNotFoundError:
        versions = "unknown"
    key = hashlib.sha1(f"{sys.prefix}|{versions}".encode()).hexdigest()[:12]
    return os.path.join(os.path.expanduser("~/.cache/autotune/torch_extensions"), key)


# torch's JIT loader takes the same lock for a no-op up-to-date check (well under a second)
# on every load; a process killed inside it (a probe rank SIGKILLed during initialize) leaves
# the lock behind and every later load waits forever. Where the op is already built, a lock
# older than this is such a leftover: the folder's key (environment and versions) means the
# op is never rebuilt in place.
STALE_LOCK_OF_BUILT_OP_S = 60


def remove_stale_build_locks(root: str) -> None:
    """Delete build locks left by killed processes (see the two thresholds above)."""
    import glob
    import time

    if not os.path.isdir(root):
        return
    for folder, _, files in os.walk(root):
        if "lock" in files:
            lock = os.path.join(folder, "lock")
            built = bool(glob.glob(os.path.join(folder, "*.so")))
            limit = STALE_LOCK_OF_BUILT_OP_S if built else STALE_BUILD_LOCK_S
            try:
                if time.time() - os.path.getmtime(lock) > limit:
                    os.remove(lock)
            except OSError:
                pass


def sweep_stale_build_locks(root: str) -> threading.Event:
    """Clear leftover locks every 5 s in a daemon thread until the returned event is set:
    torch's loader waits on a lock without ever looking at it again, and a process killed
    moments ago leaves a fresh one."""
    done = threading.Event()

    def sweep() -> None:
        while not done.wait(5.0):
            remove_stale_build_locks(root)

    threading.Thread(target=sweep, name="autotune-lock-sweep", daemon=True).start()
    return done


def partial_offload_supported() -> bool:
    """Whether this DeepSpeed knows ``offload_optimizer.ratio`` (partial offload, ZeRO-3)."""
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig

    return "ratio" in DeepSpeedZeroOffloadOptimizerConfig.model_fields


def async_io_problem(hardware: Hardware) -> str | None:
    """Why DeepSpeed's async I/O op (needed for NVMe offload) cannot be used, or None."""
    os.environ.setdefault("DS_ACCELERATOR", hardware.accelerator)
    os.environ["TORCH_EXTENSIONS_DIR"] = torch_extensions_dir()
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("AsyncIOBuilder")
    if builder is None:
        return f"DeepSpeed has no async I/O op for the {hardware.accelerator} accelerator"
    if not builder.is_compatible(verbose=False):
        return "DeepSpeed's async I/O op needs libaio (apt install libaio-dev)"
    try:
        builder.load(verbose=False)
    except Exception as exc:  # noqa: BLE001 - compiler errors come in many types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"DeepSpeed's async I/O op does not build here ({first})"
    return None


def ensure_deepspeed_ops(hardware: Hardware, *, cpu_offload: bool) -> None:
    """Build (once; cached by torch) the DeepSpeed ops the probes will JIT-load.

    Without this the first probe that needs an op pays its compilation (about 40 s for CPU
    Adam here) inside its timed run and its timeout.
    """
    import importlib

    os.environ.setdefault("DS_ACCELERATOR", hardware.accelerator)
    os.environ["TORCH_EXTENSIONS_DIR"] = torch_extensions_dir()
    remove_stale_build_locks(os.environ["TORCH_EXTENSIONS_DIR"])
    names = ["FusedAdamBuilder"]
    if cpu_offload:
        names.append("CPUAdamBuilder")
    if hardware.accelerator == "cpu":
        names.append("ShareMemCommBuilder")
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError as exc:  # pragma: no cover - deepspeed is a dependency
        raise HardwareError(f"cannot import DeepSpeed ({exc}); pip install deepspeed") from None
    accelerator = get_accelerator()
    loading = sweep_stale_build_locks(os.environ["TORCH_EXTENSIONS_DIR"])
    try:
        for name in names:
            builder = accelerator.create_op_builder(name)
            if builder is None:
                continue
            try:
                importlib.import_module("deepspeed.ops")
                builder.load(verbose=False)
            except Exception as exc:  # noqa: BLE001 - compiler errors come in many types
                raise HardwareError(
                    f"DeepSpeed cannot build its {builder.NAME} op here ({type(exc).__name__}: "
                    f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); install "
                    "a C++ compiler (and for CUDA ops, the CUDA toolkit), or remove the option "
                    "that needs it from the space"
                ) from None
    finally:
        loading.set()


def _main(argv: list[str] | None = None) -> int:
    """``python -m autotune.hardware [--build-ops]``: print what this machine offers."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m autotune.hardware", description=__doc__)
    parser.add_argument("--build-ops", action="store_true", help="Pre-build DeepSpeed's ops.")
    args = parser.parse_args(argv)
    hardware = detect()
    print(hardware.describe(hardware.device_count if hardware.accelerator == "cuda" else 1))
    if args.build_ops:
        ensure_deepspeed_ops(hardware, cpu_offload=True)
        print("DeepSpeed ops built")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
