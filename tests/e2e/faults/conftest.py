"""Helpers for fault tests: the real CLI in subprocesses, a small space, a measured study."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
import pytest

from tests.support.cli import run_cli
from tests.support.cli_study import base_args
from tests.support.processes import probe_processes


def load(workdir: Path, name: str = "gpt-tiny") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{workdir}/trials/autotune.db")


def evaluated(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [
        t
        for t in study.get_trials()
        if "duplicate_of" not in t.user_attrs and "confirmation_of" not in t.user_attrs
    ]


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def assert_no_probe_left(timeout_s: float = 30) -> None:
    """No torchrun agent or rank survives (the kernel may take a moment to reap them)."""
    deadline = time.monotonic() + timeout_s
    while probe_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert probe_processes() == [], probe_processes()


class Driver:
    """``autotune run`` in its own session, as a terminal would hold it."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.log_path = cwd / f"driver-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in wait()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "autotune.cli", *args],
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    @property
    def output(self) -> str:
        return self.log_path.read_text()

    def wait_probing(self, timeout_s: float = 240) -> None:
        """Until a probe's ranks run (torchrun agent + 2 ranks)."""
        wait_for(
            lambda: "probing" in self.output and len(probe_processes()) >= 3,
            timeout_s,
            f"a probe to run; driver said:\n{self.output}",
        )

    def ctrl_c(self) -> None:
        """SIGINT to the driver's whole process group, as a terminal's Ctrl-C does."""
        os.killpg(self.process.pid, signal.SIGINT)

    def wait(self, timeout_s: float = 120) -> int:
        try:
            code = self.process.wait(timeout=timeout_s)
        finally:
            self._log.close()
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._log.close()


@pytest.fixture(scope="package")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A study with two completed probes (local executor), to be copied by tests."""
    workdir = tmp_path_factory.mktemp("measured")
    args = base_args(workdir, "--executor", "local", "--max-trials", "2", "--budget", "3m")
    result = run_cli(*args, "--seed", "0", cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len([t for t in evaluated(load(workdir)) if t.user_attrs["status"] == "ok"]) == 2
    return workdir


@pytest.fixture
def copy_of_measured(measured: Path, tmp_path: Path) -> Iterator[Path]:
    workdir = tmp_path / "study"
    shutil.copytree(measured, workdir)
    # the space file is referenced by absolute path in the study's flags: keep the original
    yield workdir
