"""A probe job of gpt-tiny on 2 CPU ranks, as the tests that launch probes directly use it;
what a probe's folder says about where its ranks ran."""

from __future__ import annotations

from pathlib import Path

from autotune.backends import get_backend
from autotune.candidate import Candidate
from autotune.execution.launch import ProbeJob
from autotune.protocol import ProbeSpec

CANDIDATE = Candidate(
    precision="fp32",
    zero_stage=2,
    micro_batch_size=4,
    gradient_accumulation_steps=2,
    data_parallel_size=2,
)


def make_job(
    tmp_path: Path,
    *,
    fault: str = "none",
    limit_bytes: int = 8 * 2**30,
    timeout_s: float = 300,
    candidate: Candidate = CANDIDATE,
) -> ProbeJob:
    spec = ProbeSpec(
        workload="gpt-tiny",
        candidate=candidate,
        backend_config=get_backend(candidate.backend).render_config(candidate),
        accelerator="cpu",
        vram_limit_bytes=limit_bytes,
        device_memory_bytes=24 * 2**30,
        tokens_per_sample=64,
        fault=fault,
        warmup_steps=1,
        timed_steps=3,
    )
    return ProbeJob(
        spec=spec,
        trial_dir=str(tmp_path / "trial"),
        world_size=2,
        timeout_s=timeout_s,
        threads_per_rank=1,
        cwd=str(tmp_path),
    )


def nodes_of(trial_dir: Path) -> set[str]:
    """The Ray node ids of a cluster probe's ranks, from the headers of its probe.log."""
    lines = (trial_dir / "probe.log").read_text().splitlines()
    headers = [line for line in lines if line.startswith("===== rank ")]
    return {line.split("(node ")[1].split(")")[0] for line in headers}
