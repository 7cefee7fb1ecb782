"""The kernel locks around DeepSpeed's op builds and loads.

torch compiles an op into ``<TORCH_EXTENSIONS_DIR>/<op>/`` under a ``lock`` file that holds
no pid, so a lock left by a killed process cannot be told from a live build by looking at
it. Every autotune process loads ops holding ``flock`` on the sibling file
``<op>.autotune-lock``: the kernel drops it when its holder dies, so a ``lock`` whose op
has no live flock holder is a leftover and is removed, and one with a live holder never
is, however old.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator

LOCK_SUFFIX = ".autotune-lock"


# One op load at a time in this process; the depth per lock file lets a load nest inside
# another holder of the same op's lock in this process (ensure_deepspeed_ops around DeepSpeed's
# loader) without locking against itself.
_LOCAL = threading.RLock()
_DEPTH: dict[str, int] = {}


@contextlib.contextmanager
def op_lock(root: str, op: str, on_wait: Callable[[], None] | None = None) -> Iterator[bool]:
    """Hold ``op``'s kernel lock under ``root`` while torch builds or loads it; yields
    whether a leftover ``lock`` of a killed process was removed. Blocks while another live
    process holds it (calling ``on_wait`` first), for as long as that build takes."""
    path = os.path.join(root, op + LOCK_SUFFIX)
    with _LOCAL:
        if _DEPTH.get(path):
            _DEPTH[path] += 1
            try:
                yield False
            finally:
                _DEPTH[path] -= 1
            return
        os.makedirs(root, exist_ok=True)
        # The lock file is never deleted: a path that always names one inode keeps
        # two processes from locking two different files.
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                fcntl.flock(fd, fcntl.LOCK_EX)
            # Every autotune loader holds this lock while torch's lock exists, so one found
            # now was left by a process killed inside torch's loader.
            cleared = _remove(os.path.join(root, op, "lock"))
            _DEPTH[path] = 1
            try:
                yield cleared
            finally:
                _DEPTH.pop(path, None)
        finally:
            os.close(fd)  # releases the flock


def _remove(path: str) -> bool:
    try:
        os.remove(path)
    except FileNotFoundError:
        return False
    return True
