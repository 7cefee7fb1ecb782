"""Text every backend's ``launch.sh`` shares."""

from __future__ import annotations

import shlex
from collections.abc import Mapping


def export_lines(env: Mapping[str, str]) -> str:
    """``export`` lines of ``env``, each keeping a value the caller's environment already
    has."""
    return "".join(
        f'export {name}="${{{name}:-{shlex.quote(value)}}}"\n' for name, value in env.items()
    )
