"""autotune's own cache folder, kept between runs: what is slow to find out and does not
change while the machine and the installed libraries stay the same (DeepSpeed's built ops,
py-cpuinfo's answer, traced activation profiles and parameter counts)."""

from __future__ import annotations

import os


def cache_root() -> str:
    """``$XDG_CACHE_HOME/autotune``, else ``~/.cache/autotune``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "autotune")
