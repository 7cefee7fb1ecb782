"""What a continued study takes back of the flags it was started with.

A study stores its flags (:meth:`autotune.cli._flags.RunFlags.stored`) but those that concern one
run; a continue takes them back under the flags given. A stored flag that names a file or
code is taken back only on the host that stored it and where the file is this user's: a
shared database must not choose what is imported or where files go.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection
from pathlib import Path
from typing import Any

from autotune.errors import SettingsError

HOST_KEY = "_host"  # in a study's stored flags: the host it was started on


def _names_a_file(flag: str, value: Any) -> bool:
    if value is None:
        return False
    if flag == "workload":
        return ":" in str(value)  # path/to/file.py:fn or package.module:fn: code to import
    if flag == "space":
        return Path(str(value)).suffix in (".yaml", ".yml") or "/" in str(value)
    return True


def _owned_here(value: str) -> bool:
    """The file (or the nearest folder above it that exists) belongs to this user."""
    path = Path(value.rpartition(":")[0] if ":" in value else value)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return path.stat().st_uid == os.getuid()
    except OSError:
        return False


def inherited(
    stored: dict[str, Any],
    given: dict[str, Any],
    *,
    kept: Collection[str],
    file_flags: Collection[str],
) -> dict[str, Any]:
    """The stored flags a continue takes back (those of ``kept``, the flags a study keeps);
    refuses, in one line, a stored file or code reference (``file_flags``) from another host
    or another user's file (give those flags explicitly)."""
    known = {k: v for k, v in stored.items() if k in kept}
    if not known:
        return {}
    same_host = stored.get(HOST_KEY) == socket.gethostname()
    foreign = [
        flag
        for flag in file_flags
        if flag not in given
        and _names_a_file(flag, known.get(flag))
        and not (same_host and _owned_here(str(known[flag])))
    ]
    if foreign == ["trials_dir"]:
        known.pop("trials_dir")  # this host's default folder, not the stored one
    elif foreign:
        origin = stored.get(HOST_KEY) or "an unknown host"
        shown = " ".join(
            f"--{f.replace('_', '-')} {known[f]}" for f in foreign if f != "trials_dir"
        )
        raise SettingsError(
            f"this study was started on {origin} with files this run will not take from the "
            f"database ({shown}); give them explicitly to continue here, e.g. "
            + " ".join(f"--{f.replace('_', '-')} PATH" for f in foreign if f != "trials_dir")
        )
    return known
