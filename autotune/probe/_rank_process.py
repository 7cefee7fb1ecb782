"""What both kinds of probe rank (a built-in workload's, :mod:`autotune.probe.rank`, and a
script's, :mod:`autotune.probe.script_rank`) do alike as processes: die with their launcher,
find their device, quiet libraries, record peaks (device and host) and versions, write
their report, leave the process group, and leave at once on failure."""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from autotune.probe import _host_peak as host_peak
from autotune.protocol import NODE_ENV, ProbeSpec, RankReport
from autotune.settings import TF32_CUBLAS_OVERRIDE_ENV

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


def start_host_peak() -> None:
    """Measure this rank's host memory peak from here (each candidate's start): a warm
    worker's lifetime maximum (ru_maxrss) would mix candidates."""
    host_peak.METER.start()


def record_host_memory(report: RankReport) -> None:
    """The rank's peak resident memory since :func:`start_host_peak`, how it was measured,
    and the node whose RAM it used."""
    report.host_peak_bytes, report.host_peak_method = host_peak.METER.peak()
    report.node = os.environ.get(NODE_ENV) or socket.gethostname()


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
    # what cuBLAS follows on CUDA: "1" forces TF32 whatever the precision ('' where unset)
    versions["tf32_cublas_override"] = os.environ.get(TF32_CUBLAS_OVERRIDE_ENV, "")
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

    from autotune.backends import get_backend

    quiet_libraries()
    get_backend(spec.candidate.backend).start_process_group()
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


def record_peaks(report: RankReport, tracker: Any, device: Any, cuda: Any) -> None:
    """The candidate's peaks: the CPU tracker's, or on CUDA the allocator's, its reserved
    peak plus the largest memory outside it measured during the candidate (``cuda``, a
    :class:`~autotune.probe._cuda_memory.CudaMemoryLimit`)."""
    import torch

    if device.type != "cuda":
        report.peak_allocated_bytes = tracker.peak_bytes
        return
    cuda.finish(report)
    report.peak_allocated_bytes = int(torch.cuda.max_memory_allocated(device))
    # What the device had to provide: the allocator's reserve plus what lies outside it.
    report.peak_reserved_bytes = int(torch.cuda.max_memory_reserved(device)) + cuda.largest_bytes


def write_report(report: RankReport, directory: Path) -> None:
    path = directory / f"rank-{report.rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(report.model_dump_json(indent=1), encoding="utf-8")
    os.replace(tmp, path)


def leave_now(report: RankReport, spec_path: Path, started: float) -> None:
    """Write the report of a rank that stops here and exit at once: peers may be blocked in
    a collective, interpreter teardown would abort in gloo/NCCL destructors, and the launcher
    stops the other ranks."""
    record_host_memory(report)
    report.wall_s = time.perf_counter() - started
    write_report(report, spec_path.parent)
    sys.stdout.flush()
    sys.stderr.flush()
    end_children()
    os._exit(1)


def end_children() -> None:
    """Kill this rank's child processes before it exits without teardown: a script's
    DataLoader workers would otherwise outlive it by seconds (they notice their parent's
    exit only at their next status check) and hold memory the next probe is judged by.

    SIGCHLD goes back to its default first: the DataLoader's own handler raises in this
    thread when one of its workers dies (``_error_if_any_worker_fails``), which would turn
    the end of a finished probe into a failure."""
    import psutil

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()


def leave_process_group() -> None:
    """Leave the process group together, so no rank aborts in a destructor at exit."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def posted_jobs(inbox: Path) -> Iterator[tuple[int, Path]]:
    """The jobs a warm worker posts to ``inbox`` (``job-000001.json`` ...), each as its
    number and spec path, in order, until one says stop. Every rank reads the same files,
    so all agree on the order."""
    import json

    number = 1
    while True:
        job_path = inbox / f"job-{number:06d}.json"
        while not job_path.exists():
            time.sleep(0.02)
        job = json.loads(job_path.read_text(encoding="utf-8"))
        if job.get("stop"):
            return
        yield number, Path(job["spec"])
        number += 1


@contextlib.contextmanager
def output_to(path: Path) -> Any:
    """Send this process's stdout and stderr (file descriptors 1 and 2) to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
