"""One probe rank: ``python -m autotune.probe.rank --spec spec.json``, under torchrun or forked by
:mod:`autotune.probe.fork_ranks` (CPU).

Each rank builds the workload (at ZeRO-3 under ``deepspeed.zero.Init``, partitioned as it
is built; at other stages on the device in the target dtype), calls ``deepspeed.initialize``
with the candidate's config, runs warm-up steps (where, on CPU, tensor memory is traced and
the limit enforced), then times optimizer steps, and writes a
:class:`~autotune.protocol.RankReport` to ``rank-<r>.json`` next to the spec, with the
process's peak resident memory over the candidate (:mod:`autotune.probe._host_peak`). While
a candidate runs, DeepSpeed cannot reset the device's peak counters
(:mod:`autotune.probe._peak_guard`). A failure is
data: the rank reports ``oom`` or ``error`` and exits without tearing down collectives
(its launcher stops its peers).

Ranks that probe several candidates (a warm worker, several ``--spec``) drop every
reference to a candidate's engine before collecting and emptying caches, and check at the
start of the next candidate that nothing of the earlier ones is still allocated, nor left
outside the allocator (communicators) beyond what the first candidate held; if something
is, they report ``unclean`` and exit, and their launcher probes the candidate in
a fresh group. The memory side (limit, leak check, release, what counts as an OOM) is
:mod:`autotune.probe._rank_memory`; how the model is built, :mod:`autotune.probe._model_build`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from autotune.probe import _cuda_memory as cuda_memory
from autotune.probe import _engine_state as engine_state
from autotune.probe import _rank_memory as rank_memory
from autotune.probe._loss_run import record_losses
from autotune.probe._model_build import build_model, make_batch
from autotune.probe._peak_guard import peak_counters_kept
from autotune.probe._rank_memory import classify_failure, dismantle, leak_tolerance_bytes
from autotune.probe._rank_process import (
    device_of,
    leave_now,
    leave_process_group,
    output_to,
    posted_jobs,
    record_host_memory,
    record_peaks,
    start_candidate,
    start_host_peak,
    write_report,
)
from autotune.probe._timed_steps import PROGRESS_FILE, reporting, time_steps, timed_step, warm_up
from autotune.protocol import ProbeSpec, RankReport

# What the "leak" fault keeps alive (a test double for a library holding on to an engine).
_KEPT_BY_FAULT: list[Any] = []


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


def run_rank(
    spec: ProbeSpec,
    report: RankReport,
    started: float,
    device: Any,
    progress_file: Path | None = None,
) -> None:
    """Build, initialise, warm up, time; fill ``report``. Every reference to the engine lives
    in this frame (helpers hold it only while they run) and is gone when it returns, so the
    caller's collection frees it."""
    from autotune.backends import get_backend

    if spec.loss_run is not None:
        record_losses(spec, report, device)
        return
    backend = get_backend(spec.candidate.backend)
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    tracker, cuda = _set_up(spec, report, device)
    if cuda is not None:
        report.overhead_left_bytes = cuda.left_bytes()
        if report.overhead_left_bytes > leak_tolerance_bytes(spec.vram_limit_bytes):
            return  # earlier candidates left too much outside the allocator: unclean
    from autotune.workloads import get_workload
    from autotune.workloads.blocks import shard_units

    candidate = spec.candidate
    with tracker:
        workload = get_workload(spec.workload)
        model, report.build = build_model(workload, spec, device, backend)
        if spec.fault == "leak" and rank == world_size - 1:
            _keep_alive(model, spec, device)
        engine = backend.initialize_engine(model, spec.backend_config, shard_units(workload, model))
        report.init_s = time.perf_counter() - started
        report.loss_scale_at_start = engine_state.loss_scale(engine)
        held_in = backend.parameter_precision(candidate)
        batch = make_batch(workload, candidate.micro_batch_size, device, held_in)
        _inject(spec.fault, rank, world_size)
        step = functools.partial(timed_step, engine, workload, batch, candidate, device)
        if cuda is not None:  # DeepSpeed's groups connect in the first step: measure again
            step = cuda.after_first_step(step)
        if progress_file is not None and rank == 0:
            step = reporting(step, report, progress_file)
        warmup_skipped = warm_up(step, spec, report)
    timed_skipped = time_steps(step, spec, report)
    report.skipped_steps = warmup_skipped + timed_skipped
    if not report.step_times_s:
        raise RuntimeError(
            f"fp16 loss scaling skipped every timed step ({timed_skipped} overflows after "
            f"{warmup_skipped} in warm-up): the loss scale never settled; check the model or "
            "the fp16 block of the base config"
        )
    record_peaks(report, tracker, device, cuda)
    _record_engine_state(report, engine)
    report.pinned_host_bytes_at_end = rank_memory.pinned_host_bytes(device)
    if hasattr(engine, "destroy"):  # removes ZeRO-3's hooks and partitioned buffers
        engine.destroy()
    dismantle(engine, model)


def _record_engine_state(report: RankReport, engine: Any) -> None:
    """What the engine did, read from it after the timed steps: the optimizer that
    stepped, its fp16 loss scale, where its host tensors live."""
    report.optimizer = engine_state.optimizer_name(engine)
    if hasattr(engine, "sharding_state"):  # FSDP2's engine says how it sharded the model
        report.sharding = engine.sharding_state()
    report.loss_scale_at_end = engine_state.loss_scale(engine)
    pinned, pageable = engine_state.host_tensor_bytes(engine_state.stepping_optimizer(engine))
    report.offloaded_pinned_bytes, report.offloaded_pageable_bytes = pinned, pageable


def _set_up(
    spec: ProbeSpec, report: RankReport, device: Any
) -> tuple[Any, cuda_memory.CudaMemoryLimit | None]:
    """Process group, numeric settings and the memory limit of one candidate: the CPU
    tracker (or a null context on CUDA) and, on CUDA, the candidate's limit (its memory
    outside the allocator measured at the start)."""
    import torch

    start_candidate(spec, report, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        cuda = cuda_memory.CudaMemoryLimit(spec, device)
        cuda.start()
        return contextlib.nullcontext(), cuda
    from autotune.probe._memtrack import TensorMemoryTracker, live_tensors

    tracker = TensorMemoryTracker(limit_bytes=spec.vram_limit_bytes)
    # What is still alive counts toward this peak, as a device's allocator would count it.
    tracker.adopt(live_tensors("cpu"))
    return tracker, None


def _keep_alive(model: Any, spec: ProbeSpec, device: Any) -> None:
    """The "leak" fault: keep the model and twice the leak tolerance alive for good."""
    import torch

    held = torch.empty(2 * leak_tolerance_bytes(spec.vram_limit_bytes), dtype=torch.uint8)
    _KEPT_BY_FAULT.extend([model, held.to(device)])


def probe_spec(spec_path: Path, started: float) -> None:
    """Probe one spec and write this rank's report beside it; on failure, or when earlier
    candidates left memory behind (``unclean``), write the report and exit."""
    start_host_peak()  # this candidate's own host memory peak, also in a warm rank
    spec = ProbeSpec.model_validate_json(spec_path.read_text(encoding="utf-8"))
    report = RankReport(rank=int(os.environ.get("RANK", "0")), status="ok", pid=os.getpid())
    tolerance = leak_tolerance_bytes(spec.vram_limit_bytes)
    try:
        device = device_of(spec)
        report.leaked_bytes = rank_memory.leaked_bytes(device)
        report.pinned_host_bytes_at_start = rank_memory.pinned_host_bytes(device)
        if report.leaked_bytes <= tolerance:
            with peak_counters_kept():  # DeepSpeed's resets would drop build and init
                run_rank(spec, report, started, device, spec_path.parent / PROGRESS_FILE)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a report
        report.status, report.error = classify_failure(exc)
        if report.status == "error":
            traceback.print_exc()
        leave_now(report, spec_path, started)
    unclean = unclean_error(report, tolerance)
    if unclean:
        report.status, report.error = "unclean", unclean
        leave_now(report, spec_path, started)
    record_host_memory(report)
    report.wall_s = time.perf_counter() - started
    write_report(report, spec_path.parent)
    rank_memory.release(spec.accelerator)


def unclean_error(report: RankReport, tolerance_bytes: int) -> str:
    """Why earlier candidates' memory stops this one ('' when it may probe): allocated
    bytes, or bytes outside the allocator (communicators), beyond the tolerance."""
    if report.leaked_bytes > tolerance_bytes:
        return (
            f"{report.leaked_bytes} bytes of earlier candidates still allocated at the start "
            f"(more than {tolerance_bytes}); the ranks must restart"
        )
    if report.overhead_left_bytes > tolerance_bytes:
        return (
            f"{report.overhead_left_bytes} bytes outside the allocator (communicators, "
            f"workspaces) beyond what the first candidate held, left by earlier candidates "
            f"(more than {tolerance_bytes}); the ranks must restart"
        )
    return ""


def serve(inbox: Path) -> None:
    """Probe the jobs posted to ``inbox`` in order (``job-000001.json`` ...), until a job
    says stop: a warm worker that pays interpreter start, imports and process-group set-up
    once for many probes. Every rank reads the same job files, so all agree on the order;
    each job's output goes to its own ``probe.log``."""
    for _, spec_path in posted_jobs(inbox):
        started = time.perf_counter()
        with output_to(spec_path.parent / "probe.log"):
            probe_spec(spec_path, started)


def main(argv: list[str] | None = None) -> int:
    """Probe each ``--spec`` in turn, or serve the jobs of ``--serve INBOX``."""
    from autotune.probe._rank_process import die_with_parent

    started = time.perf_counter()
    die_with_parent()  # launcher killed (its driver died): this rank goes too, even if hung
    # Python 3.10 puts the working folder first on the path for -m (3.11+: PYTHONSAFEPATH);
    # a yaml.py or torch.py the user keeps there must not shadow the real packages
    sys.path[:] = [entry for entry in sys.path if entry not in ("", os.getcwd())]
    from autotune.backends import prepare_rank_process

    # each backend's process set-up (DeepSpeed: op loads hold a kernel lock; a killed
    # loader's leftover lock is cleared)
    prepare_rank_process()
    parser = argparse.ArgumentParser(prog="python -m autotune.probe.rank", description=__doc__)
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
    leave_process_group()
    return 0


if __name__ == "__main__":
    from autotune.process_exit import exit_without_teardown

    exit_without_teardown(main())
