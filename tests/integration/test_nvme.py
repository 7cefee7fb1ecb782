"""NVMe offload with real DeepSpeed on 2 CPU ranks (needs libaio for DeepSpeed's async I/O
op): ZeRO-3 swaps optimizer states and parameters to disk, each probe's swap folder is
removed after it, and the parameter swap buffer holds the largest parameter partition.

DeepSpeed's default parameter buffers (5 x 1e8 elements per rank) are what made NVMe probes
slow here; these probes size them to the model instead (buffer_count 2, and buffer_size
raised from a deliberately small base value to the largest partition)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.backends import get_backend
from autotune.backends.deepspeed import DEFAULT_BASE_CONFIG
from autotune.candidate import Candidate
from autotune.execution.launch import ProbeJob, launch_probes
from autotune.hardware import detect
from autotune.protocol import ProbeSpec

DEEPSPEED = get_backend("deepspeed")

pytestmark = pytest.mark.slow

# gpt-tiny's largest parameter is its 4096 x 128 token embedding (tied to the LM head): a
# 262,144-element partition on each of 2 ranks.
SMALL_BUFFER = 10_000


def nvme_job(
    root: Path, name: str, candidate: Candidate, nvme_path: Path, *, scratch: bool
) -> ProbeJob:
    from autotune.memory.memory_model import largest_layer_params
    from autotune.workloads import get_workload

    base = {
        **DEFAULT_BASE_CONFIG,
        "zero_optimization": {
            "offload_param": {"buffer_size": SMALL_BUFFER, "buffer_count": 2},
            "offload_optimizer": {"buffer_count": 4},
        },
    }
    largest = largest_layer_params(get_workload("gpt-tiny"))
    config = DEEPSPEED.render_config(
        candidate, base, nvme_path=str(nvme_path), largest_param_numel=largest
    )
    spec = ProbeSpec(
        workload="gpt-tiny",
        candidate=candidate,
        backend_config=config,
        accelerator="cpu",
        vram_limit_bytes=20 * 2**30,
        device_memory_bytes=24 * 2**30,
        tokens_per_sample=64,
        warmup_steps=1,
        timed_steps=1,
    )
    return ProbeJob(
        spec=spec,
        trial_dir=str(root / name),
        world_size=2,
        timeout_s=300,
        threads_per_rank=1,
        cwd=str(root),
        scratch_dir=str(nvme_path) if scratch else None,
    )


def candidate(param: str) -> Candidate:
    return Candidate(
        precision="fp32",
        zero_stage=3,
        offload_optimizer="nvme",
        offload_param=param,
        micro_batch_size=2,
        gradient_accumulation_steps=1,
        data_parallel_size=2,
    )


@pytest.mark.nvme_op
def test_nvme_offload_trains_and_each_swap_folder_is_removed(tmp_path: Path) -> None:
    from autotune.backends.deepspeed.ops import async_io_problem

    problem = async_io_problem(detect())
    if problem:
        pytest.skip(f"NVMe offload not testable here: {problem}")
    scratch = tmp_path / "nvme" / "autotune" / "study" / "trial-0000"
    kept = tmp_path / "nvme-kept"
    jobs = [
        nvme_job(tmp_path, "optimizer", candidate("none"), scratch, scratch=True),
        nvme_job(tmp_path, "both", candidate("nvme"), kept, scratch=False),
    ]
    assert (
        jobs[1].spec.backend_config["zero_optimization"]["offload_param"]["buffer_size"] == 262_144
    )
    results = launch_probes(jobs)
    assert [(r.status, r.error) for r in results] == [("ok", "")] * 2
    assert not scratch.exists()  # the probe's swap folder went with it
    assert scratch.parent.is_dir()  # nothing above it
    # the job without a scratch folder shows what DeepSpeed wrote: parameters and optimizer
    # states, in zero_stage_3/{float32params,optimizer}/rank<r>/*.tensor.swp
    swapped = {p.relative_to(kept).parts[:3] for p in kept.rglob("*.tensor.swp")}
    expected = {
        ("zero_stage_3", kind, f"rank{rank}")
        for kind in ("float32params", "optimizer")
        for rank in (0, 1)
    }
    assert swapped == expected, sorted(str(p) for p in kept.rglob("*"))
