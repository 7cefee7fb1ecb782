"""Every benchmark says how to run it: ``--help`` of each script or package (and subcommand)
works."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
COMMANDS = [
    ["-m", "benchmarks.gpu_check"],
    ["backends_side_by_side.py"],
    ["launch_cost.py"],
    ["memory_accuracy.py"],
    ["memory_vs_table.py"],
    ["overhead.py"],
    ["plan_tables.py"],
    ["prepare_gpu_wheels.py"],
    ["screenshots.py"],
    ["script_memory_accuracy.py"],
    ["script_overhead.py"],
    ["search_efficiency.py", "dump"],
    ["search_efficiency.py", "replay"],
    ["search_efficiency.py", "ideal"],
    ["verify_cost.py"],
    ["vs_deepspeed_autotuner.py"],
    ["world_size_prediction.py"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_works(command: list[str]) -> None:
    script = command if command[0] == "-m" else [str(BENCHMARKS / command[0]), *command[1:]]
    done = subprocess.run(
        [sys.executable, *script, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=BENCHMARKS.parent,  # a package (-m) is found from the repository root
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:")
