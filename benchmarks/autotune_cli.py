"""``autotune ARGS`` in a folder, as a user types it, for the benchmarks that drive the CLI:
its output, or the benchmark ends with what the command printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def autotune_cli(
    folder: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``env``: variables added to this process's environment (a cluster's token)."""
    done = subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0:
        raise SystemExit(f"autotune {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done
