"""A study in a real PostgreSQL server: run, continue, status, and the driver lock, the same
as with SQLite. `.ci/run` installs and starts the server and sets
AUTOTUNE_TEST_POSTGRES_URL; elsewhere the test skips and says so."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import optuna
import pytest

from tests.conftest import run_cli
from tests.faults.conftest import base_args

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
