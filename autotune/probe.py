"""One probe rank: ``python -m autotune.probe --spec spec.json`` under torchrun.

Each rank builds the workload, calls ``deepspeed.initialize`` with the candidate's config,
runs warm-up steps (where, on CPU, tensor memory is traced and the limit enforced), then
times optimizer steps, and writes a :class:`~autotune.protocol.RankReport` to
``rank-<r>.json`` next to the spec. A failure is data: the rank reports ``oom`` or
``error`` and exits without tearing down collectives (torchrun stops its peers).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

from autotune import steps
from autotune.protocol import ProbeSpec, RankReport

OOM_MARKERS = ("out of memory", "outofmemoryerror")


def is_oom(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or an OOM another layer wrapped into a RuntimeError."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(marker in text for marker in OOM_MARKERS)


def _host_peak_bytes() -> int:
    """Resident memory of this rank now (called at the end of a probe, after the optimizer
    states exist); a warm worker's lifetime maximum (ru_maxrss) would mix probes."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def _versions() -> dict[str, str]:
    import deepspeed
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__}
    versions["deepspeed"] = deepspeed.__version__
    with contextlib.suppress(ImportError):
        import transformers

        versions["transformers"] = transformers.__version__
    return versions


def _quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    with contextlib.suppress(ImportError):
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(logging.WARNING)


def _inject(fault: str, rank: int, world_size: int) -> None:
    """Faults for tests of the tuner (named as such in ProbeSpec.fault)."""
    if fault == "none" or rank != world_size - 1:
        return
    import torch

    if fault == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory (injected fault for testing)")
    if fault == "error":
        raise RuntimeError("injected fault for testing: a rank raised")
    if fault == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "hang":
        # Like a rank stuck inside a collective's C++ code: deaf to SIGTERM, only SIGKILL
        # (or its parent's death) ends it. The peers block in their next collective.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(3600)


def run_rank(spec: ProbeSpec, report: RankReport, started: float) -> Any:
    """Build, initialise, warm up, time. Fills ``report``; returns the engine."""
    import deepspeed
    import torch

    _quiet_libraries()
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = spec.accelerator == "cuda"
    if cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        # The caching allocator raises OutOfMemoryError at the limit, as a smaller GPU would.
        fraction = min(1.0, spec.vram_limit_bytes / spec.device_memory_bytes)
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        tracker: Any = contextlib.nullcontext()
    else:
        from autotune.memtrack import TensorMemoryTracker

        device = torch.device("cpu")
        tracker = TensorMemoryTracker(limit_bytes=spec.vram_limit_bytes)

    deepspeed.init_distributed()
    report.versions = _versions()
    report.threads = torch.get_num_threads()
    from autotune.workloads import get_workload

    candidate = spec.candidate
    with tracker:
        workload = get_workload(spec.workload)
        model = workload.build_model()
        if candidate.activation_checkpointing:
            workload.enable_activation_checkpointing(model)
        engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=spec.ds_config,
        )
        report.init_s = time.perf_counter() - started
        batch = workload.make_batch(candidate.micro_batch_size, device)
        _inject(spec.fault, rank, world_size)
        warmup_started = time.perf_counter()
        max_warmup = spec.max_warmup_steps or spec.warmup_steps
        while not steps.warmed_up(report.warmup_step_times_s, spec.warmup_steps, max_warmup):
            report.warmup_step_times_s.append(
                _timed_step(engine, workload, batch, candidate, device)
            )
        report.warmup_s = time.perf_counter() - warmup_started

    # Adaptive length and early stop decide on the agreed (slowest-rank) times, so all
    # ranks stop after the same step.
    max_timed = spec.max_timed_steps or spec.timed_steps
    while not steps.timed_enough(
        report.step_times_s,
        min_steps=spec.timed_steps,
        max_steps=max_timed,
        target=spec.target_spread,
        max_s=spec.max_timed_s,
    ):
        report.step_times_s.append(_timed_step(engine, workload, batch, candidate, device))
        if steps.clearly_slower(
            report.step_times_s, candidate.train_batch_size, spec.stop_below_samples_per_s
        ):
            report.stopped_early = True
            break

    if cuda:
        report.peak_allocated_bytes = int(torch.cuda.max_memory_allocated(device))
        report.peak_reserved_bytes = int(torch.cuda.max_memory_reserved(device))
    else:
        report.peak_allocated_bytes = tracker.peak_bytes
    return engine


def _timed_step(engine: Any, workload: Any, batch: Any, candidate: Any, device: Any) -> float:
    """One optimizer step's time, the slowest rank's (all ranks get the same number)."""
    import torch
    import torch.distributed as dist

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    _optimizer_step(engine, workload, batch, candidate.gradient_accumulation_steps)
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = torch.tensor([time.perf_counter() - started], device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def _optimizer_step(engine: Any, workload: Any, batch: Any, accumulation_steps: int) -> None:
    # DeepSpeed wants step() after every backward; it steps the optimizer at the boundary.
    for _ in range(accumulation_steps):
        loss = workload.loss(engine, batch)
        engine.backward(loss)
        engine.step()


def _write_report(report: RankReport, directory: Path) -> None:
    path = directory / f"rank-{report.rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(report.model_dump_json(indent=1), encoding="utf-8")
    os.replace(tmp, path)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


def probe_spec(spec_path: Path, started: float) -> None:
    """Probe one spec and write this rank's report beside it. On failure the process
    exits at once: peers may be blocked in a collective, interpreter teardown would abort
    in gloo/NCCL destructors, and torchrun stops the other ranks."""
    spec = ProbeSpec.model_validate_json(spec_path.read_text(encoding="utf-8"))
    report = RankReport(rank=int(os.environ.get("RANK", "0")), status="ok", pid=os.getpid())
    try:
        engine = run_rank(spec, report, started)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a report
        report.status = "oom" if is_oom(exc) else "error"
        report.error = _first_line(exc)
        report.host_peak_bytes = _host_peak_bytes()
        report.wall_s = time.perf_counter() - started
        if report.status == "error":
            import traceback

            traceback.print_exc()
        _write_report(report, spec_path.parent)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    report.host_peak_bytes = _host_peak_bytes()
    report.wall_s = time.perf_counter() - started
    _write_report(report, spec_path.parent)
    _release(engine, spec.accelerator)


def serve(inbox: Path) -> None:
    """Probe the jobs posted to ``inbox`` in order (``job-000001.json`` ...), until a job
    says stop: a warm worker that pays interpreter start, imports and process-group set-up
    once for many probes. Every rank reads the same job files, so all agree on the order;
    each job's output goes to its own ``probe.log``."""
    number = 1
    while True:
        job_path = inbox / f"job-{number:06d}.json"
        while not job_path.exists():
            time.sleep(0.02)
        job = json.loads(job_path.read_text(encoding="utf-8"))
        if job.get("stop"):
            return
        spec_path = Path(job["spec"])
        started = time.perf_counter()
        with _output_to(spec_path.parent / "probe.log"):
            probe_spec(spec_path, started)
        number += 1


@contextlib.contextmanager
def _output_to(path: Path) -> Any:
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


def main(argv: list[str] | None = None) -> int:
    """Probe each ``--spec`` in turn, or serve the jobs of ``--serve INBOX``."""
    from autotune.launch import die_with_parent

    started = time.perf_counter()
    die_with_parent()  # torchrun killed (its driver died): this rank goes too, even if hung
    from autotune.ops import guard_op_loads

    guard_op_loads()  # op loads hold a kernel lock; a killed loader's leftover lock is cleared
    parser = argparse.ArgumentParser(prog="python -m autotune.probe", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--spec", type=Path, action="append", help="ProbeSpec JSON (repeatable).")
    source.add_argument("--serve", type=Path, help="Inbox folder of a warm worker.")
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve)
    else:
        for spec_path in args.spec:
            probe_spec(spec_path, started)
            started = time.perf_counter()
    _leave_process_group()
    return 0


def _release(engine: Any, accelerator: str) -> None:
    """Free one candidate's engine before the next is built in the same process."""
    import gc

    import torch

    if hasattr(engine, "destroy"):  # removes ZeRO-3's hooks and partitioned buffers
        engine.destroy()
    del engine
    gc.collect()
    if accelerator == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    else:
        _trim_host_heap()


def _trim_host_heap() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``): without it a warm
    worker's resident memory ratchets up over candidates of a 124M model until the kernel's
    OOM killer takes a rank (seen at 11 GB after 30 candidates on a 24 GB host)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        return


def _leave_process_group() -> None:
    """Leave the process group together, so no rank aborts in a destructor at exit."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
