"""Real DeepSpeed probes on 2 CPU ranks through torchrun: status classification and cleanup.

A CUDA out-of-memory cannot happen on this CPU machine; the OOM here is the real CPU limit
enforced by the tensor-memory tracker, and the crash and hang are injected faults of the
probe (ProbeSpec.fault), named as such.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autotune.candidate import Candidate
from autotune.launch import ProbeJob, launch_probe, launch_probes
from autotune.protocol import ProbeSpec
from tests.conftest import probe_processes

pytestmark = pytest.mark.slow

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
        ds_config=candidate.to_ds_config(),
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


def assert_no_probe_left() -> None:
    deadline = time.monotonic() + 10
    while probe_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert probe_processes() == []


def test_ok_probe_measures_throughput_and_memory(tmp_path: Path) -> None:
    result = launch_probe(make_job(tmp_path))
    assert result.status == "ok", result.error + result.log_tail
    assert result.samples_per_s > 0 and len(result.step_times_s) == 3
    assert result.tokens_per_s == pytest.approx(result.samples_per_s * 64)
    assert result.samples_per_s_min <= result.samples_per_s <= result.samples_per_s_max
    assert len(result.peak_bytes_per_rank) == 2 and min(result.peak_bytes_per_rank) > 1_000_000
    assert result.threads_per_rank == 1
    assert result.exit_code == 0
    assert result.versions["deepspeed"]
    log = (tmp_path / "trial" / "probe.log").read_text()
    assert "terminate called" not in log and "Traceback" not in log
    assert (tmp_path / "trial" / "ds_config.json").is_file()
    assert_no_probe_left()


def test_rank_over_the_memory_limit_is_oom(tmp_path: Path) -> None:
    result = launch_probe(make_job(tmp_path, limit_bytes=2 * 2**20))
    assert result.status == "oom", result.error + result.log_tail
    assert "exceeds the limit of 2097152 bytes" in result.error
    assert_no_probe_left()


def test_crashed_rank_is_error_naming_the_rank(tmp_path: Path) -> None:
    result = launch_probe(make_job(tmp_path, fault="crash"))
    assert result.status == "error"
    assert "rank 1 died first" in result.error and "SIGKILL" in result.error
    assert_no_probe_left()


def test_hung_rank_is_killed_at_the_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    result = launch_probe(make_job(tmp_path, fault="hang", timeout_s=40))
    assert result.status == "timeout"
    assert time.monotonic() - started < 40 + 15
    assert_no_probe_left()


def test_adaptive_length_and_early_stop_in_one_warm_group(tmp_path: Path) -> None:
    """Warm-up until steps settle, timing until the interval is tight (or the cap), and an
    early stop once clearly slower than a threshold; all ranks stop after the same step."""
    from autotune.worker import WarmWorker

    worker = WarmWorker()
    try:
        base = make_job(tmp_path)
        adaptive = base.model_copy(
            update={
                "trial_dir": str(tmp_path / "adaptive"),
                "spec": base.spec.model_copy(
                    update={
                        "max_warmup_steps": 6,
                        "timed_steps": 3,
                        "max_timed_steps": 12,
                        "target_spread": 0.5,  # loose: three steps are enough
                    }
                ),
            }
        )
        result = worker.run(adaptive)
        assert result.status == "ok", result.error + result.log_tail
        assert len(result.step_times_s) == 3 and 1 <= result.warmup_steps <= 6
        assert not result.stopped_early

        tight = adaptive.model_copy(
            update={
                "trial_dir": str(tmp_path / "tight"),
                "spec": adaptive.spec.model_copy(
                    update={"target_spread": 1e-6, "max_timed_steps": 7}
                ),
            }
        )
        result = worker.run(tight)
        assert result.status == "ok" and len(result.step_times_s) == 7  # hit the cap

        hopeless = adaptive.model_copy(
            update={
                "trial_dir": str(tmp_path / "hopeless"),
                "spec": adaptive.spec.model_copy(
                    update={"target_spread": 1e-6, "stop_below_samples_per_s": 1e9}
                ),
            }
        )
        result = worker.run(hopeless)
        assert result.status == "ok" and result.stopped_early
        assert len(result.step_times_s) == 3  # the minimum for a verdict
    finally:
        worker.close()
    assert_no_probe_left()


def test_a_crash_in_a_shared_launch_fails_only_its_own_candidate(tmp_path: Path) -> None:
    """Candidates probed in one launch: the first finished on every rank before the second
    crashed the launch, so it stays ``ok``; the second is the error."""
    first = make_job(tmp_path).model_copy(update={"trial_dir": str(tmp_path / "a")})
    second = make_job(tmp_path, fault="crash").model_copy(update={"trial_dir": str(tmp_path / "b")})
    ok, crashed = launch_probes([first, second])
    assert ok.status == "ok" and ok.samples_per_s > 0, ok.error
    assert crashed.status == "error" and "rank 1 died first" in crashed.error
    assert_no_probe_left()
