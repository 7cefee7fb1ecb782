"""README's command 1 as a newcomer runs it on a fresh machine: the venv's ``autotune`` by
its path (the venv not activated, so its bin is not on PATH), in an empty folder, with no
DeepSpeed op built yet. The one-time op build must not eat the budget: the run ends with
an exported config.

The ops this run builds seed the default op cache as soon as they are built (tests/conftest.py
runs this test first; slow tests in other xdist workers wait for them), so the rest of the
suite does not build them again.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.cli_study import EXPORTED_CONFIGS
from tests.support.ops import copy_built_ops
from tests.support.paths import ROOT
from tests.support.unit_order import mark_ops_seeded

VENV_BIN = os.path.dirname(sys.executable)
OPS_BUILT = "once for this environment (not charged to the budget)"  # autotune/tuner.py


def readme_command() -> list[str]:
    """The ``autotune ...`` part of README's command 1 (``... && .venv/bin/autotune run ...``)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("# 1.", 1)[1].split("# 2.", 1)[0]
    found = re.search(r"\.venv/bin/autotune ([^\n`]+)", block)
    assert found, "README's command 1 no longer runs .venv/bin/autotune"
    return shlex.split(found.group(1))


def test_readme_command_1_parses_to_a_run() -> None:
    args = readme_command()
    assert args[0] == "run" and "--budget" in args


@pytest.mark.slow
def test_readme_command_1_exports_from_an_empty_op_cache_without_activation(
    tmp_path: Path, start_nvme_build: Callable[[], None]
) -> None:
    from autotune.backends.deepspeed.ops import torch_extensions_dir

    autotune = os.path.join(VENV_BIN, "autotune")
    assert os.access(autotune, os.X_OK), f"{autotune} missing: pip install -e ."
    work = tmp_path / "work"
    work.mkdir()
    ops = tmp_path / "torch_extensions"
    ops.mkdir()
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(
        entry for entry in env.get("PATH", "").split(os.pathsep) if entry and entry != VENV_BIN
    )
    env["TORCH_EXTENSIONS_DIR"] = str(ops)
    env["PYTHONUNBUFFERED"] = "1"  # each line as it is printed: the build's end is read live
    default_ops = os.environ.get("TORCH_EXTENSIONS_DIR") or torch_extensions_dir()

    def seed() -> None:
        copy_built_ops(str(ops), default_ops)
        mark_ops_seeded()
        start_nvme_build()  # the async I/O op, beside this run's study

    run = subprocess.Popen(
        [autotune, *readme_command()],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    watchdog = threading.Timer(30 * 60, run.kill)
    watchdog.start()
    lines: list[str] = []
    try:
        for line in run.stdout:
            lines.append(line)
            if OPS_BUILT in line:  # the study starts: the rest of the suite may use the ops
                seed()
        returncode = run.wait()
    finally:
        watchdog.cancel()
        if run.poll() is None:
            run.kill()
            run.wait()
        seed()
    printed = "".join(lines)
    output = f"{printed[:2000]}\n...\n{printed[-3000:]}"
    assert returncode == 0, output
    assert any(OPS_BUILT in line for line in lines), output
    best = work / "trials" / "gpt-tiny" / "best"
    assert any((best / name).is_file() for name in EXPORTED_CONFIGS), output  # either backend's
    assert list(ops.glob("fused_adam/*.so")), "the ops were not built in the empty cache"
    # built without debug information (same code, ~45% less compile CPU), optimised as ever
    ninja = (ops / "fused_adam" / "build.ninja").read_text(encoding="utf-8")
    cflags = next(line for line in ninja.splitlines() if line.startswith("cflags")) + " "
    assert " -O3 " in cflags and " -g " not in cflags, cflags
