"""Whether a folder can take a run's files, asked without leaving a file or folder behind.

A run checks its folders and its SQLite storage before it writes anything: a folder that
does not exist yet is judged by its nearest existing ancestor, where a temporary file is
written, synced and removed (root ignores permission bits, so only a write tells; a
read-only mount, a full disk or a file in the way all fail it).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

__all__ = ["check_folder_writable", "why_not_writable"]


def check_folder_writable(folder: Path) -> None:
    """Raise ``OSError`` (naming the folder it tried) unless ``folder`` exists or could be
    created, and could take a file; writes nothing that stays."""
    existing = folder.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "a file is in the way", str(existing))
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".autotune-write-check-") as probe:
            probe.write(b"x" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:  # named by the folder, not by the temporary file
        raise OSError(exc.errno, exc.strerror, str(existing)) from None


def why_not_writable(exc: OSError) -> str:
    """The reason in a few words, for one line of error."""
    if exc.errno == errno.ENOSPC:
        return "the disk is full"
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"
