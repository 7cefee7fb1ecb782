"""Scratch folders held by a live process, and the sweep of those whose holder died.

A warm worker (and a rank actor on a Ray node) keeps its inbox and logs in a folder of the
temporary directory and removes it when it closes. A holder killed with SIGKILL, or lost with
its node, cannot; the next holder of the same kind removes what such holders left.

The holder keeps an exclusive ``flock`` on a file in the folder for its life. The kernel
drops the lock when the process ends, however it ends, so a folder whose lock another process
can take has no holder: no pid (reused) or clock (skewed) is compared. The lock file gets its
name only once it is locked, so a folder is never taken for abandoned while it is created.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

LOCK_NAME = ".held"


class HeldFolder:
    """A new folder ``<tmp>/<prefix>XXXXXXXX``, held until :meth:`remove` (or the process
    ends); abandoned folders of the same prefix are removed first."""

    def __init__(self, prefix: str, root: str | None = None) -> None:
        sweep_abandoned(prefix, root)
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        partial = self.path / f"{LOCK_NAME}.{os.getpid()}"
        self._lock = open(partial, "w")  # noqa: SIM115 - held for the folder's life
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.replace(partial, self.path / LOCK_NAME)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.close()


def sweep_abandoned(prefix: str, root: str | None = None) -> list[Path]:
    """Remove the folders ``<root>/<prefix>*`` whose holder has ended; the removed ones.
    A folder without a lock file (being created, or not a held folder) is left alone."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{prefix}*"):
        try:
            lock = open(folder / LOCK_NAME)  # noqa: SIM115 - closed below
        except OSError:
            continue
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: its holder is alive
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                removed.append(folder)
    return removed
