"""A study in a real PostgreSQL server: run, continue, status, and the driver lock, the same
as with SQLite. `.ci/run` installs and starts the server and sets
AUTOTUNE_TEST_POSTGRES_URL; elsewhere the test skips and says so."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import optuna
import pytest

from tests.support.cli import run_cli
from tests.support.cli_study import base_args

pytestmark = pytest.mark.slow

URL = os.environ.get("AUTOTUNE_TEST_POSTGRES_URL", "")


@pytest.mark.skipif(not URL, reason="AUTOTUNE_TEST_POSTGRES_URL is not set (.ci/run sets it)")
def test_postgres_study_runs_and_continues(tmp_path: Path) -> None:
    name = f"pg-{uuid.uuid4().hex[:8]}"
    first = run_cli(
        *base_args(tmp_path, "--executor", "local", "--max-trials", "1", "--budget", "5m"),
        "--storage",
        URL,
        "--study",
        name,
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    second = run_cli("run", "--study", name, "--storage", URL, "--max-trials", "1", cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "1 candidate(s) evaluated before" in second.stdout
    study = optuna.load_study(study_name=name, storage=URL)
    trials = [t for t in study.get_trials() if "duplicate_of" not in t.user_attrs]
    assert [t.user_attrs["status"] for t in trials] == ["ok", "ok"]
    assert len({t.user_attrs["candidate_key"] for t in trials}) == 2
    assert not study.user_attrs.get("autotune_driver")  # the lock was given back
    assert study.user_attrs["autotune_budget"]["total_s"] == 300
    status = run_cli("status", "--storage", URL, "--study", name, cwd=tmp_path)
    assert status.returncode == 0 and f"study {name}" in status.stdout


SHARED_SPACE = """\
precision: [fp32]
zero_stage: [0, 1, 2]
offload_optimizer: [none]
offload_param: [none]
micro_batch_size: [2, 4, 8]
activation_checkpointing: [false]
"""


@pytest.mark.skipif(not URL, reason="AUTOTUNE_TEST_POSTGRES_URL is not set (.ci/run sets it)")
def test_two_shared_drivers_never_probe_a_candidate_twice(tmp_path: Path) -> None:
    """Two drivers (here two processes; the same holds on two hosts) on one PostgreSQL
    study with --shared: each takes its own proposals, no candidate is probed by both, and
    neither fails the other's running trials. An exclusive driver is refused meanwhile."""
    import subprocess
    import sys
    import time

    from autotune.study.records import views

    name = f"shared-{uuid.uuid4().hex[:8]}"
    (tmp_path / "space.yaml").write_text(SHARED_SPACE)
    args = [
        sys.executable, "-m", "autotune.cli", "run", "--workload", "gpt-tiny", "--gpus", "1",
        "--space", "space.yaml", "--global-batch", "8", "--executor", "local", "--shared",
        "--max-trials", "4", "--budget", "4m", "--no-confirm", "--warmup-steps", "1",
        "--timed-steps", "2", "--max-timed-steps", "2", "--storage", URL, "--study", name,
    ]  # fmt: skip
    drivers = []
    for index in range(2):
        log = open(tmp_path / f"driver-{index}.log", "w")  # noqa: SIM115 - closed below
        drivers.append(
            (subprocess.Popen([*args, "--seed", str(index)], cwd=tmp_path, stdout=log,
                              stderr=subprocess.STDOUT), log)
        )  # fmt: skip
        time.sleep(3)
    try:
        time.sleep(20)
        exclusive = run_cli("run", "--study", name, "--storage", URL, cwd=tmp_path, timeout=120)
        assert exclusive.returncode == 2, exclusive.stdout + exclusive.stderr
        assert "is being run by another driver" in exclusive.stderr
        assert "--shared" in exclusive.stderr
        codes = [process.wait(timeout=600) for process, _ in drivers]
    finally:
        for process, log in drivers:
            if process.poll() is None:
                process.kill()
            log.close()
    outputs = [(tmp_path / f"driver-{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], outputs
    study = optuna.load_study(study_name=name, storage=URL)
    trials = views(study)
    probed = [t for t in trials if t.is_evaluation and t.record.probe_wall_s is not None]
    keys = [t.record.candidate_key for t in probed]
    assert len(probed) >= 4 and len(keys) == len(set(keys)), "a candidate was probed twice"
    assert not [t for t in trials if t.status == "interrupted"], "a driver failed another's"
    assert not [t for t in trials if t.running]
    holders = {k: v for k, v in study.user_attrs.items() if k.startswith("autotune_driver")}
    assert not any(holders.values())  # every lock record given back
