"""Processes of this test session: its tag, its live probes, and children reaped again
after Ray."""

from __future__ import annotations

import os
import signal
import uuid


def reap_children() -> None:
    """Undo what ``ray.init`` does to this process: Ray ignores SIGCHLD at the OS level, every
    child inherits that across exec, and ``Popen.wait`` then gets ECHILD and reports exit
    code 0 whatever the child returned (a test of an error exit passes or fails by chance;
    py-cpuinfo inside DeepSpeed's op builder hangs)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


# Every process this test session starts inherits this tag, orphans included: the "no
# probe left" checks look only at probes of this session, not at another study running on
# the same machine (a benchmark, a second checkout's tests).
# Under pytest-xdist each worker is a session of its own, with a tag of its own (a worker
# inherits the controller's environment).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["AUTOTUNE_TEST_TAG"] = f"{uuid.uuid4().hex}-{os.environ['PYTEST_XDIST_WORKER']}"
TEST_TAG = os.environ.setdefault("AUTOTUNE_TEST_TAG", uuid.uuid4().hex)


def probe_processes() -> list[str]:
    """Command lines of live probe processes (launchers, torchrun agents and ranks) of this
    session; a forked rank has its launcher's command line."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or [])
            modules = (
                "autotune.probe.rank",
                "autotune.probe.script_rank",
                "autotune.probe.fork_ranks",
            )
            if not any(module in cmdline for module in modules):
                continue
            if process.environ().get("AUTOTUNE_TEST_TAG") == TEST_TAG:
                found.append(cmdline)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found
