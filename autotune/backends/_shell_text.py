"""Text every backend's ``launch.sh`` shares."""

from __future__ import annotations

import shlex
from collections.abc import Mapping


def export_lines(env: Mapping[str, str], *, keep_callers: bool = True) -> str:
    """``export`` lines of ``env``, each keeping a value the caller's environment already
    has; with ``keep_callers`` False, each set as given whatever the caller's environment
    holds (what production must compute with, as the probes did: an inherited value would
    undo it)."""
    if not keep_callers:
        return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())
    return "".join(
        f'export {name}="${{{name}:-{shlex.quote(value)}}}"\n' for name, value in env.items()
    )


def printable(text: str) -> str:
    """One line of plain text: control characters (a newline ends a shell comment) become
    spaces."""
    return "".join(ch if ch.isprintable() else " " for ch in text)
