"""What both kinds of probe rank (a built-in workload's, :mod:`autotune.probe.rank`, and a
script's, :mod:`autotune.probe.script_rank`) do alike as processes: die with their launcher,
find their device, quiet libraries, record peaks and versions, write their report, leave the
process group, and leave at once on failure."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import signal
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from autotune.probe import _rank_memory as rank_memory
from autotune.protocol import ProbeSpec, RankReport

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent thread ends (Linux only).

    prctl(PR_SET_PDEATHSIG) survives exec. If the parent is already gone (re-parented to
    init or a subreaper before the call), exit at once.
    """
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the timeouts still bound a probe
        return
    if os.getppid() != parent or parent == 1:
        os._exit(1)


def host_peak_bytes() -> int:
    """Resident memory of this rank now (called at the end of a probe, after the optimizer
    states exist); a warm worker's lifetime maximum (ru_maxrss) would mix probes."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def versions(device: Any) -> dict[str, str]:
    """Library versions, and the numeric settings that change fp32 speed (TF32)."""
    import deepspeed
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__}
    versions["deepspeed"] = deepspeed.__version__
    # from the installed metadata: importing transformers would cost a rank seconds of CPU
    # where the workload (a DiT, a plain script) does not use it
    with contextlib.suppress(PackageNotFoundError):
        versions["transformers"] = version("transformers")
    versions["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    versions["cuda_matmul_allow_tf32"] = str(torch.backends.cuda.matmul.allow_tf32)
    versions["cudnn_allow_tf32"] = str(torch.backends.cudnn.allow_tf32)
    if device.type == "cuda":
        versions["cuda"] = str(torch.version.cuda)
        versions["device"] = torch.cuda.get_device_name(device)
    return versions


def quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    with contextlib.suppress(ImportError):
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)


def start_candidate(spec: ProbeSpec, report: RankReport, device: Any) -> None:
    """What every candidate of a built-in rank starts with: quiet libraries, the process
    group, its numeric settings, and the versions and threads its report states."""
    import torch

    from autotune.backends import DEFAULT_BACKEND, get_backend

    quiet_libraries()
    get_backend(DEFAULT_BACKEND).start_process_group()
    # Explicit for every candidate: production's setting, never the previous candidate's.
    torch.set_float32_matmul_precision(spec.float32_matmul_precision)
    report.versions = versions(device)
    report.threads = torch.get_num_threads()


def device_of(spec: ProbeSpec) -> Any:
    import torch

    if spec.accelerator == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def record_peaks(report: RankReport, tracker: Any, device: Any, overhead: int) -> None:
    import torch

    if device.type != "cuda":
        report.peak_allocated_bytes = tracker.peak_bytes
        return
    overhead = max(overhead, rank_memory.cuda_overhead_bytes(device))
    report.device_overhead_bytes = overhead
    report.peak_allocated_bytes = int(torch.cuda.max_memory_allocated(device))
    # What the device had to provide: the allocator's reserve plus what lies outside it.
    report.peak_reserved_bytes = int(torch.cuda.max_memory_reserved(device)) + overhead


def write_report(report: RankReport, directory: Path) -> None:
    path = directory / f"rank-{report.rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(report.model_dump_json(indent=1), encoding="utf-8")
    os.replace(tmp, path)


def leave_now(report: RankReport, spec_path: Path, started: float) -> None:
    """Write the report of a rank that stops here and exit at once: peers may be blocked in
    a collective, interpreter teardown would abort in gloo/NCCL destructors, and the launcher
    stops the other ranks."""
    report.host_peak_bytes = host_peak_bytes()
    report.wall_s = time.perf_counter() - started
    write_report(report, spec_path.parent)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def leave_process_group() -> None:
    """Leave the process group together, so no rank aborts in a destructor at exit."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
