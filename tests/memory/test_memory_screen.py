"""The memory screen on CUDA: the limit its predictions must fit under leaves out the memory
the study's probes measured outside the caching allocator (context, NCCL, cuBLAS).

No GPU here: the probe results are made up, a CUDA probe's measurement
(:func:`fake_cuda_probe`), recorded into a real Optuna study as a real probe's would be."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.candidate import Candidate
from autotune.memory import Limits, MemoryScreen
from autotune.protocol import ModelInfo, ProbeResult, RankReport
from autotune.study import records
from autotune.workloads import get_workload

MiB = 2**20
MARGIN = 0.05
CANDIDATE = Candidate(
    precision="bf16",
    zero_stage=2,
    micro_batch_size=8,
    gradient_accumulation_steps=1,
    data_parallel_size=8,
)
PROBED = CANDIDATE.model_copy(update={"micro_batch_size": 1, "gradient_accumulation_steps": 8})


def fake_cuda_probe(overhead_bytes_per_rank: list[int]) -> ProbeResult:
    """What a CUDA probe of PROBED would return (made up: no GPU here), with the memory its
    ranks measured outside the allocator."""
    return ProbeResult(
        status="ok",
        samples_per_s=10.0,
        step_times_s=[0.1, 0.1],
        peak_bytes_per_rank=[100 * MiB] * len(overhead_bytes_per_rank),
        overhead_bytes_per_rank=overhead_bytes_per_rank,
    )


def screen_after(
    result: ProbeResult, limit_bytes: int, workload: Any = None, trial_dir: str = ""
) -> MemoryScreen:
    """A CUDA study's screen (of gpt-tiny unless ``workload``) that has learnt one probe,
    stored as the tuner stores it."""
    screen = MemoryScreen(
        workload or get_workload("gpt-tiny"),
        Limits(
            accelerator="cuda",
            vram_limit_bytes=limit_bytes,
            margin=MARGIN,
            host_ram_bytes=2**40,
            ranks_per_node=8,
        ),
    )
    study = optuna.create_study(directions=["maximize"])
    trial = study.ask()
    record = records.TrialRecord(
        candidate=PROBED, vram_limit_bytes=limit_bytes, trial_dir=trial_dir
    )
    records.record_probe(study, trial, record, result)
    screen.learn(records.TrialView.of(study.trials[0]))
    return screen


def test_the_screen_leaves_the_measured_overhead_out_of_the_limit() -> None:
    """A candidate whose predicted tensors fit the limit less the margin, but not once the
    largest overhead a probe measured is taken off the limit too, is ruled out, by the
    bytes it is over that reduced limit."""
    predicted = screen_after(fake_cuda_probe([0]), 2**40).predict(CANDIDATE)
    assert predicted.prediction is not None
    peak = predicted.prediction.predicted_peak_bytes
    limit = int(peak / (1 - MARGIN) * 1.02)  # fits by 2% with no overhead
    overhead = limit // 20  # the largest rank's: NVLS buffers, DeepSpeed's groups
    assert screen_after(fake_cuda_probe([0, 0]), limit).verdict(CANDIDATE).fits

    screen = screen_after(fake_cuda_probe([overhead // 2, overhead]), limit)
    assert screen.overhead_bytes_by_world == {8: overhead}
    verdict = screen.verdict(CANDIDATE)
    assert not verdict.fits and verdict.pruned_by == "memory-model"
    assert verdict.over_bytes == pytest.approx(peak - (limit - overhead) * (1 - MARGIN))
    assert "measured outside the allocator" in verdict.reason


def test_a_scripts_screen_does_not_take_the_overhead_off_twice(tmp_path: Path) -> None:
    """A script's model is learnt from its probes' measured peaks, which on CUDA hold the
    memory outside the allocator already (the reserved peak plus the overhead): its
    predictions are judged against the limit less the margin alone."""
    model = ModelInfo(
        params=1_000_000, trainable_params=1_000_000, largest_param=250_000, small_params=0,
        dtype="bfloat16",
    )  # fmt: skip
    overhead = 600 * MiB
    reserved = 300 * MiB + overhead  # the probe's peak: allocator's reserve and overhead
    for rank in (0, 1):
        report = RankReport(
            rank=rank, status="ok", model=model, activation_bytes=MiB, peak_reserved_bytes=reserved
        )
        (tmp_path / f"rank-{rank}.json").write_text(report.model_dump_json(), encoding="utf-8")
    probe = fake_cuda_probe([overhead, overhead]).model_copy(
        update={"reserved_bytes_per_rank": [reserved] * 2}
    )
    script = types.SimpleNamespace(script="train.py")  # what the screen asks of a script
    estimate = screen_after(probe, 2**40, script, str(tmp_path)).predict(CANDIDATE)
    assert estimate.prediction is not None
    peak = estimate.prediction.predicted_peak_bytes
    assert peak > reserved  # the measured peak, the overhead in it, and more activations
    limit = int(peak / (1 - MARGIN) * 1.02)
    screen = screen_after(probe, limit, script, str(tmp_path))
    assert screen.verdict(CANDIDATE).fits
    assert screen.overhead_bytes_by_world == {8: overhead}
    assert screen.outside_allocator_bytes(8) == 0


def test_the_overhead_taken_off_is_the_one_measured_at_the_candidates_world_size() -> None:
    """Communicators grow with the ranks they connect: a candidate on 1 rank does not lose
    what an 8-rank probe measured; a world size not yet measured takes the nearest larger
    one measured, else the largest measured."""
    screen = screen_after(fake_cuda_probe([0]), 2**40)
    screen.overhead_bytes_by_world = {1: 100 * MiB, 4: 300 * MiB, 8: 900 * MiB}
    assert screen.outside_allocator_bytes(1) == 100 * MiB
    assert screen.outside_allocator_bytes(2) == 300 * MiB  # nearest larger measured
    assert screen.outside_allocator_bytes(8) == 900 * MiB
    assert screen.outside_allocator_bytes(16) == 900 * MiB  # beyond: the largest measured
    single = CANDIDATE.model_copy(update={"data_parallel_size": 1})
    peak = screen.predict(single).prediction.predicted_peak_bytes
    limit = int(peak / (1 - MARGIN)) + 200 * MiB
    screen.limits = dataclasses.replace(screen.limits, vram_limit_bytes=limit)
    assert screen.verdict(single).fits  # 100 MiB off its limit, not the 8-rank 900 MiB
