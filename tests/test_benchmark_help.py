"""Every benchmark says how to run it: ``--help`` of each script (and subcommand) works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
COMMANDS = [
    ["gpu_check.py"],
    ["launch_cost.py"],
    ["memory_accuracy.py"],
    ["memory_vs_table.py"],
    ["overhead.py"],
    ["plan_tables.py"],
    ["prepare_gpu_wheels.py"],
    ["screenshots.py"],
    ["script_memory_accuracy.py"],
    ["search_efficiency.py", "dump"],
    ["search_efficiency.py", "replay"],
    ["vs_deepspeed_autotuner.py"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_works(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / command[0]), *command[1:], "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:")
