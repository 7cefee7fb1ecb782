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
    ["activation_dial/activation_dial.py"],
    ["backends_side_by_side/backends_side_by_side.py"],
    ["gpu_check/activation_offload.py"],
    ["gpu_check/prepare_gpu_wheels.py"],
    ["memory_accuracy/memory_accuracy.py"],
    ["memory_accuracy/memory_vs_table.py"],
    ["memory_accuracy/plan_tables.py"],
    ["memory_accuracy/script_memory_accuracy.py"],
    ["overhead/launch_cost.py"],
    ["overhead/overhead.py"],
    ["overhead/script_overhead.py"],
    ["screenshots/screenshots.py"],
    ["search_efficiency/search_efficiency.py", "dump"],
    ["search_efficiency/search_efficiency.py", "ideal"],
    ["search_efficiency/search_efficiency.py", "replay"],
    ["search_efficiency/short_study_live.py"],
    ["verify_cost/verify_cost.py"],
    ["vs_deepspeed/vs_deepspeed_autotuner.py"],
    ["world_size/world_size_prediction.py"],
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
