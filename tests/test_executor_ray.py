"""The Ray executor: a probe as a Ray core task, production threading, cancellation."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autotune.executor import RayExecutor
from tests.conftest import probe_processes
from tests.test_probe import make_job

pytestmark = pytest.mark.slow


def _wait_result(executor: RayExecutor, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = executor.wait(1.0)
        if done:
            return done[0][1]
    raise AssertionError("no result")


def test_probe_runs_as_ray_task_with_production_threads(ray_cluster, tmp_path: Path) -> None:
    executor = RayExecutor(total_devices=2, devices_per_probe=2, cuda=False, cpu_count=2)
    assert executor.capacity == 1
    job = make_job(tmp_path).model_copy(update={"threads_per_rank": 2})
    executor.submit(job)
    result = _wait_result(executor, 300)
    assert result.status == "ok", result.error + result.log_tail
    # Ray exports OMP_NUM_THREADS=<num_cpus of the task>; the probe overrides it.
    assert result.threads_per_rank == 2


def test_cancel_kills_the_probe_processes(ray_cluster, tmp_path: Path) -> None:
    executor = RayExecutor(total_devices=2, devices_per_probe=2, cuda=False, cpu_count=2)
    executor.submit(make_job(tmp_path, fault="hang", timeout_s=300))
    deadline = time.monotonic() + 60
    while len(probe_processes()) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(probe_processes()) >= 3  # torchrun agent + 2 ranks
    executor.cancel_all()
    deadline = time.monotonic() + 20
    while probe_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert probe_processes() == []
