"""Fixed-length probes on CPU ranks, launched together: how the benchmarks
(memory_accuracy.py, vs_deepspeed_autotuner.py) and tests/benchmarks/test_deepspeed_matrix.py
measure candidates outside a study."""

from __future__ import annotations

from pathlib import Path

from autotune.backends import get_backend
from autotune.candidate import Candidate
from autotune.execution import ProbeJob
from autotune.protocol import ProbeSpec
from autotune.workloads import get_workload


def cpu_probe_jobs(
    workload: str,
    candidates: list[Candidate],
    root: Path,
    *,
    warmup_steps: int,
    timed_steps: int,
    timeout_s: float,
    ranks: int = 2,
    threads_per_rank: int = 1,
    nvme_path: str | None = None,
) -> list[ProbeJob]:
    """Fixed-length probes of ``candidates`` on CPU ranks, one folder each under ``root``,
    to run together with :func:`launch_probes` (benchmarks and tests measure this way)."""
    tokens_per_sample = get_workload(workload).tokens_per_sample
    return [
        ProbeJob(
            spec=ProbeSpec(
                workload=workload,
                candidate=candidate,
                backend_config=get_backend(candidate.backend).render_config(
                    candidate, nvme_path=nvme_path
                ),
                accelerator="cpu",
                # generous: these probes measure, the host's RAM is the only limit
                vram_limit_bytes=20 * 2**30,
                device_memory_bytes=24 * 2**30,
                tokens_per_sample=tokens_per_sample,
                warmup_steps=warmup_steps,
                timed_steps=timed_steps,
            ),
            trial_dir=str(root / f"{index:02d}"),
            world_size=ranks,
            timeout_s=timeout_s,
            threads_per_rank=threads_per_rank,
            cwd=str(root),
        )
        for index, candidate in enumerate(candidates)
    ]
