"""The CLI in a subprocess, as a user types it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.processes import reap_children


def run_cli(
    *args: str, cwd: Path, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``autotune ARGS`` as a user types it, in ``cwd``."""
    full_env = {**os.environ, **(env or {})}
    reap_children()
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
