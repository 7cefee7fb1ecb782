"""``autotune ARGS`` in a folder, as a user types it, for the benchmarks that drive the CLI:
its output, or the benchmark ends with what the command printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def autotune_cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"autotune {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done
