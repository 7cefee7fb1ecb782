"""The oldest torch a backend trains with, against the torch installed here.

A backend declares its floor (``torch_floor``, with what it needs of that release); below
it the backend is left out of a study's space with one line saying why (the plan's
binding, :func:`autotune.run.bind_space`), rather than failing every probe. The installed
version is read from the distribution's metadata, so asking costs no torch import.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version


def installed_torch() -> str | None:
    """The installed torch's version ("2.13.0+cpu"), or None without one."""
    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def torch_release(found: str | None) -> tuple[int, int] | None:
    """(major, minor) of a torch version ("2.13.0+cpu" -> (2, 13)), or None unreadable."""
    parsed = re.match(r"(\d+)\.(\d+)", found or "")
    return None if parsed is None else (int(parsed[1]), int(parsed[2]))


def torch_floor_problem(floor: tuple[int, int], needs: str) -> str | None:
    """Why the installed torch is below ``floor`` (major, minor) for what ``needs`` says, in
    one line with the fix; None at or above it, or where the version cannot be read (then
    torch's own import says more than this could)."""
    found = installed_torch()
    release = torch_release(found)
    if release is None or release >= floor:
        return None
    wanted = f"{floor[0]}.{floor[1]}"
    return (
        f"it needs torch {wanted} or later ({needs}) and this environment has torch {found}; "
        f"upgrade torch (pip install 'torch>={wanted}') to search it"
    )
