"""Probes run at the scheduling priority of the run that launched them.

Ray starts its workers at nice 15 (its ``worker_niceness``, so that its own daemons come
first), and a probe's ranks are children of a Ray worker: they inherit it. Production is
launched from a shell at the user's priority, usually nice 0. Where anything else needs the
CPU (another job on the node, the data loaders of a neighbour, a test suite), a nice-15
rank gets a small fraction of the time a nice-0 one would (CFS weight 36 against 1024:
https://docs.kernel.org/scheduler/sched-nice-design.html), so the probe measures a slower
configuration than production runs, and a rank that waits long enough for the CPU misses
the driver's deadlines.

A private Ray (:mod:`autotune.execution._executor`) and a loopback cluster
(:mod:`autotune.execution.loopback_cluster`)
start their workers at the driver's niceness (``RAY_worker_niceness``). On another cluster, a
probe's process takes the driver's niceness itself (:func:`take`, run before the probe's
code: :data:`autotune.execution.launch._CLEAN_SIGNALS_EXEC`); where the node does not allow that (a
process may raise its niceness but only lower it with ``CAP_SYS_NICE`` or ``RLIMIT_NICE``),
it says so in the probe's log.
"""

from __future__ import annotations

import contextlib
import os
import sys

NICENESS_VARIABLE = "AUTOTUNE_NICENESS"  # the driver's niceness, in a probe's environment
RAY_WORKER_NICENESS = "RAY_worker_niceness"  # read by Ray's raylet and workers at start


def current() -> int:
    """This process's niceness."""
    return os.getpriority(os.PRIO_PROCESS, 0)


def take(niceness: int) -> int:
    """Lower this process's niceness to ``niceness`` where it is higher and the system allows
    it; the niceness it has after."""
    now = current()
    if now > niceness:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, niceness)
    return current()


def take_from_environment() -> None:
    """:func:`take` the niceness a probe's environment names; say in the probe's log when
    it could not be taken."""
    wanted = os.environ.get(NICENESS_VARIABLE)
    if wanted is None or not wanted.lstrip("-").isdigit():
        return
    now = take(int(wanted))
    if now > int(wanted):
        print(
            f"autotune: this probe runs at nice {now} (its Ray worker's), the run that "
            f"launched it at nice {wanted}; other load on this node slows it more than "
            f"production: start the node with {RAY_WORKER_NICENESS}={wanted}",
            file=sys.stderr,
            flush=True,
        )
