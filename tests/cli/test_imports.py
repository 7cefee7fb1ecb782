"""`autotune --help` must stay fast: no torch, deepspeed, ray or transformers at CLI import."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "deepspeed", "ray", "transformers", "optuna")


def test_cli_import_is_light() -> None:
    code = (
        "import sys, autotune, autotune.cli, autotune.workloads; "
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_help_runs_without_heavy_imports() -> None:
    code = (
        "import sys\nfrom autotune.cli import main\n"
        "for args in (['--help'], ['run', '--help'], ['status', '--help']):\n"
        "    assert main(args) == 0\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert "--workload" in out.stdout and "--budget" in out.stdout
