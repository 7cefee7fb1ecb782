"""A probe's process takes the driver's priority (autotune.execution._priority): Ray starts its
workers
at nice 15 and a probe under one would inherit it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from autotune.execution._priority import NICENESS_VARIABLE
from autotune.execution.launch import _CLEAN_SIGNALS_EXEC
from tests.support.paths import ROOT

REPORT_NICENESS = "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"


def _probe_prelude(
    niceness: str, *, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """A process started as a Ray worker starts a probe's (at nice 15), through the prelude
    every probe command runs before its module; ``prefix`` runs it (setpriv)."""

    def start_as_a_ray_worker() -> None:
        os.nice(15 - os.nice(0))

    return subprocess.run(
        [*prefix, sys.executable, "-c", _CLEAN_SIGNALS_EXEC, "-c", REPORT_NICENESS],
        env={**os.environ, NICENESS_VARIABLE: niceness, "PYTHONPATH": str(ROOT)},
        preexec_fn=start_as_a_ray_worker,
        capture_output=True,
        text=True,
        timeout=600,  # a nice-15 process waits behind everything else on a busy machine
    )


def test_a_probe_under_a_nice_worker_takes_the_drivers_priority() -> None:
    if os.geteuid() != 0:
        pytest.skip("lowering a niceness needs root (CAP_SYS_NICE) here")
    done = _probe_prelude("0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0" and done.stderr == ""


def test_where_the_node_refuses_it_the_probe_log_says_so() -> None:
    setpriv = shutil.which("setpriv")  # util-linux
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    # without CAP_SYS_NICE, as a non-root Ray worker runs
    no_nice = (setpriv, "--bounding-set=-sys_nice", "--inh-caps=-sys_nice")
    done = _probe_prelude("0", prefix=no_nice)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "15"
    line = done.stderr.strip()
    assert "this probe runs at nice 15" in line and "RAY_worker_niceness=0" in line, line


def test_a_driver_nicer_than_the_worker_is_not_followed_up() -> None:
    """A probe is never made nicer than it started (a user who runs autotune under nice 19
    on a Ray cluster: the workers' own priority stands), and says nothing."""
    done = _probe_prelude("19")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "15" and done.stderr == ""
