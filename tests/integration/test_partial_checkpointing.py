"""Real probes with a share of the blocks recomputed, or recomputed selectively, on 2 CPU
ranks, for DeepSpeed's ZeRO-0 and ZeRO-3 and FSDP2: each trains, its measured peak falls
between its neighbours', and the memory model predicts it as closely as the ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.candidate import Candidate, FsdpKnobs
from autotune.execution import launch_probes
from autotune.memory import MemoryModel
from autotune.workloads import get_workload
from tests.support.probe_jobs import make_job

pytestmark = pytest.mark.slow


def _candidate(backend: str, stage: int, fraction: float, policy: str = "full") -> Candidate:
    fsdp = {"fsdp": FsdpKnobs()} if backend == "fsdp2" else {}
    return Candidate(
        backend=backend,  # type: ignore[arg-type]
        precision="fp32",
        zero_stage=stage,  # type: ignore[arg-type]
        micro_batch_size=16,
        gradient_accumulation_steps=1,
        data_parallel_size=2,
        checkpoint_fraction=fraction,
        checkpoint_policy=policy,  # type: ignore[arg-type]
        **fsdp,
    )


@pytest.mark.parametrize(("backend", "stage"), [("deepspeed", 0), ("deepspeed", 3), ("fsdp2", 3)])
def test_half_the_blocks_recomputed_peaks_between_none_and_all(
    tmp_path: Path, backend: str, stage: int
) -> None:
    """gpt-tiny's 2 blocks: 0.5 recomputes the first; selectively, every block keeps its
    matmul and attention outputs."""
    candidates = [_candidate(backend, stage, f) for f in (0.0, 0.5, 1.0)]
    candidates.append(_candidate(backend, stage, 1.0, "selective"))
    jobs = []
    for index, candidate in enumerate(candidates):
        job = make_job(tmp_path, candidate=candidate)
        jobs.append(job.model_copy(update={"trial_dir": str(tmp_path / f"t{index}")}))
    results = launch_probes(jobs)
    assert all(r.status == "ok" for r in results), [r.error + r.log_tail for r in results]
    none, half, every, selective = (max(r.peak_bytes_per_rank) for r in results)
    assert none > half > every, (none, half, every)
    assert none > selective > every, (none, selective, every)
    model = MemoryModel(get_workload("gpt-tiny"))
    errors = [
        model.predict(c).tracked_bytes("cpu") / max(r.peak_bytes_per_rank) - 1
        for c, r in zip(candidates, results, strict=True)
    ]
    for between in (errors[1], errors[3]):
        assert abs(between) <= max(0.05, 1.5 * max(abs(errors[0]), abs(errors[2]))), errors
