"""A rank ending its children (``end_children``) before it exits: a SIGCHLD handler that
raises when a worker dies, as the DataLoader's does, must not turn the end of a finished
probe into a failure."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_ending_children_is_not_failed_by_a_sigchld_handler_that_raises() -> None:
    program = textwrap.dedent(
        """
        import signal, subprocess, sys, time
        import psutil
        from autotune.probe._rank_process import end_children

        def worker_failed(signum, frame):  # the DataLoader's handler does likewise
            raise RuntimeError("DataLoader worker is killed by signal: Killed.")

        signal.signal(signal.SIGCHLD, worker_failed)
        workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                   for _ in range(2)]
        end_children()
        for worker in workers:
            worker.wait(timeout=10)
        time.sleep(0.5)  # any SIGCHLD still pending is delivered here
        print("ended", [w.returncode for w in workers])
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ended [-9, -9]"
