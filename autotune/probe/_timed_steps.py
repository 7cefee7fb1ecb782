"""A rank's optimizer steps: one step timed and agreed across ranks, the warm-up and timing
loops around it (the decisions are :mod:`autotune.timing`'), and the progress the driver
shows while a probe runs."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune import timing as steps
from autotune.protocol import ProbeSpec, RankReport

PROGRESS_FILE = "progress.json"  # beside a probe's spec: how far it is, for the driver


def reporting(
    step: Callable[[], tuple[float, bool]], report: RankReport, path: Path
) -> Callable[[], tuple[float, bool]]:
    """``step``, writing after each one how far the probe is (``progress.json`` beside the
    spec: the driver shows it while the probe runs)."""
    done = [0]

    def counted() -> tuple[float, bool]:
        outcome = step()
        done[0] += 1
        phase = "timed" if report.warmup_s else "warm-up"
        tmp = path.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps({"phase": phase, "steps": done[0]}), encoding="utf-8")
            os.replace(tmp, path)
        return outcome

    return counted


def warm_up(step: Callable[[], tuple[float, bool]], spec: ProbeSpec, report: RankReport) -> int:
    """Untimed steps until step time settles (skipped fp16 steps extend it); the number
    of steps the loss scaler skipped."""
    started = time.perf_counter()
    max_warmup = spec.max_warmup_steps or spec.warmup_steps
    skipped: list[bool] = []
    while not steps.warmup_done(report.warmup_step_times_s, skipped, spec.warmup_steps, max_warmup):
        step_time, was_skipped = step()
        report.warmup_step_times_s.append(step_time)
        skipped.append(was_skipped)
    report.warmup_s = time.perf_counter() - started
    return sum(skipped)


def time_steps(step: Callable[[], tuple[float, bool]], spec: ProbeSpec, report: RankReport) -> int:
    """Timed steps until the interval is tight, a cap, or clearly slower than the best; the
    number of steps the loss scaler skipped (not timed). Adaptive length and early stop
    decide on the agreed (slowest-rank) times, so all ranks stop after the same step."""
    max_timed = spec.max_timed_steps or spec.timed_steps
    skipped = 0
    while not steps.timing_done(
        report.step_times_s,
        skipped,
        min_steps=spec.timed_steps,
        max_steps=max_timed,
        target=spec.target_spread,
        max_s=spec.max_timed_s,
    ):
        step_time, was_skipped = step()
        if was_skipped:
            skipped += 1
            continue
        report.step_times_s.append(step_time)
        samples = spec.candidate.train_batch_size
        if steps.clearly_slower(report.step_times_s, samples, spec.stop_below_samples_per_s):
            report.stopped_early = True
            break
    return skipped


def timed_step(
    engine: Any, workload: Any, batch: Any, candidate: Any, device: Any
) -> tuple[float, bool]:
    """One optimizer step's time, the slowest rank's, and whether any rank's fp16 loss
    scaler skipped it (all ranks get the same answer)."""
    import torch
    import torch.distributed as dist

    cuda = device.type == "cuda"
    skipped_before = int(getattr(engine, "skipped_steps", 0))
    if cuda:
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    optimizer_step(engine, workload, batch, candidate.gradient_accumulation_steps)
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - started
    skipped = int(getattr(engine, "skipped_steps", 0)) > skipped_before
    agreed = torch.tensor([elapsed, float(skipped)], device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return float(agreed[0].item()), bool(agreed[1].item() > 0)


def optimizer_step(engine: Any, workload: Any, batch: Any, accumulation_steps: int) -> None:
    # DeepSpeed wants step() after every backward; it steps the optimizer at the boundary.
    for _ in range(accumulation_steps):
        loss = workload.loss(engine, batch)
        engine.backward(loss)
        engine.step()
