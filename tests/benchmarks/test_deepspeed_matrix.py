"""Real DeepSpeed on 2 CPU ranks, 2 optimizer steps each, for every CPU-supported class of
candidate: fp32/bf16 x ZeRO 0-3 x optimizer offload none/cpu x parameter offload (ZeRO 3)
none/cpu x activation checkpointing off/on (NVMe offload: tests/test_nvme.py). All
candidates of a group run in one launch (launch_probes)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from autotune.candidate import Candidate
from autotune.execution.launch import launch_probes
from autotune.space.search_space import combination_problem
from benchmarks.probe_jobs import cpu_probe_jobs

pytestmark = pytest.mark.slow


def jobs_for(candidates: list[Candidate], root: Path):
    return cpu_probe_jobs(
        "gpt-tiny", candidates, root, warmup_steps=1, timed_steps=1, timeout_s=120
    )


def candidate(precision, stage, opt="none", param="none", ckpt=False) -> Candidate:
    return Candidate(
        precision=precision,
        zero_stage=stage,
        offload_optimizer=opt,
        offload_param=param,
        micro_batch_size=2,
        gradient_accumulation_steps=1,
        data_parallel_size=2,
        activation_checkpointing=ckpt,
    )


def test_cpu_cross_product_trains(tmp_path: Path) -> None:
    candidates = [
        candidate(prec, stage, opt, param, ckpt)
        for prec, stage, opt, param, ckpt in itertools.product(
            ("fp32", "bf16"), (0, 1, 2, 3), ("none", "cpu"), ("none", "cpu"), (False, True)
        )
        if combination_problem(stage, opt, param) is None
    ]
    assert len(candidates) == 36
    results = launch_probes(jobs_for(candidates, tmp_path))
    failures = [
        (c.label, r.error) for c, r in zip(candidates, results, strict=True) if r.status != "ok"
    ]
    assert failures == []
    by_label = {c.label: r for c, r in zip(candidates, results, strict=True)}
    for result in results:
        assert len(result.step_times_s) == 1 and result.samples_per_s > 0
        assert len(result.peak_bytes_per_rank) == 2
    # Checkpointing keeps fewer activations alive (ZeRO-0: nothing else differs).
    for precision in ("fp32", "bf16"):
        plain = by_label[f"z0 {precision} mb2x1"].peak_bytes
        checkpointed = by_label[f"z0 {precision} mb2x1 ckpt"].peak_bytes
        assert checkpointed < plain
