"""The Ray executor: a slot is a Ray actor with a warm probe worker; production threading,
reuse of the warm ranks, cancellation and close leave no process behind."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autotune.execution._executor import RayExecutor
from autotune.protocol import RankReport
from tests.support.probe_jobs import make_job
from tests.support.processes import probe_processes

pytestmark = pytest.mark.slow


def _wait_result(executor: RayExecutor, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = executor.wait(1.0)
        if done:
            return done[0][1]
    raise AssertionError("no result")


def _rank_pids(trial_dir: Path) -> set[int]:
    reports = [RankReport.model_validate_json(p.read_text()) for p in trial_dir.glob("rank-*")]
    return {report.pid for report in reports}


def _wait_no_probe(timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while probe_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    return probe_processes()


def test_warm_actor_reuses_its_ranks_with_production_threads(ray_cluster, tmp_path: Path) -> None:
    executor = RayExecutor(total_devices=2, devices_per_probe=2, cuda=False, cpu_count=2)
    try:
        assert executor.capacity == 1
        first_job = make_job(tmp_path).model_copy(
            update={"threads_per_rank": 2, "trial_dir": str(tmp_path / "a")}
        )
        executor.submit(first_job)
        first = _wait_result(executor, 300)
        assert first.status == "ok", first.error + first.log_tail
        # Ray exports OMP_NUM_THREADS=<num_cpus of the task>; the probe overrides it.
        assert first.threads_per_rank == 2
        executor.submit(first_job.model_copy(update={"trial_dir": str(tmp_path / "b")}))
        second = _wait_result(executor, 300)
        assert second.status == "ok", second.error + second.log_tail
        # The second probe ran in the ranks the first one started: no new interpreter,
        # no second import of torch and deepspeed (each costs seconds on this machine).
        assert _rank_pids(tmp_path / "a") == _rank_pids(tmp_path / "b")
        assert len(_rank_pids(tmp_path / "b")) == 2
    finally:
        executor.close()
    assert _wait_no_probe(30) == []


def test_cancel_kills_the_probe_processes(ray_cluster, tmp_path: Path) -> None:
    executor = RayExecutor(total_devices=2, devices_per_probe=2, cuda=False, cpu_count=2)
    try:
        executor.submit(make_job(tmp_path, fault="hang", timeout_s=300))
        deadline = time.monotonic() + 90
        while len(probe_processes()) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(probe_processes()) >= 3  # torchrun agent + 2 ranks
        executor.cancel_all()
        assert _wait_no_probe(30) == []
        # The cancelled probe comes back as a result, not as a lost ticket.
        result = _wait_result(executor, 30)
        assert result.status in ("error", "timeout")
    finally:
        executor.close()
    assert _wait_no_probe(30) == []


def test_a_childs_exit_code_reaches_the_tests_after_ray_starts(ray_cluster) -> None:
    """ray.init ignores SIGCHLD in this process; the fixtures restore it, else every
    subprocess a later test runs reports exit code 0 (an error exit would pass unseen)."""
    import subprocess

    assert subprocess.run(["sh", "-c", "exit 3"], check=False).returncode == 3
