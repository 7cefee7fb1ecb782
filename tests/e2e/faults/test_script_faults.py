"""Faults of a user's script as the probe, each through the real CLI: one line says what
happened, and the study goes on (or ends) without hanging.

- the script never calls deepspeed.initialize within the probe timeout;
- it crashes (where in the script is in the line);
- it stops before the probe had its optimizer steps;
- it initialises torch.distributed itself (works: torchrun's environment is set), or with a
  backend CPU ranks do not have;
- its arguments carry a launcher flag, or flags its parser does not know.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.faults.conftest import assert_no_probe_left
from tests.support.cli import run_cli
from tests.support.paths import ASSETS

pytestmark = pytest.mark.slow

SCRIPT = ASSETS / "tiny_script.py"
SPACE = "precision: [fp32]\nzero_stage: [0]\nmicro_batch_size: [2, 4]\n"
FAST = [
    "--warmup-steps", "1", "--timed-steps", "2", "--max-timed-steps", "2",
    "--no-early-stop", "--no-confirm", "--executor", "local",
]  # fmt: skip


def _run(
    tmp_path: Path, mode: str, *extra: str, after: tuple[str, ...] = (), timeout: float = 600
) -> tuple[int, str]:
    (tmp_path / "space.yaml").write_text(SPACE)
    result = run_cli(
        "run", "--script", str(SCRIPT), "--gpus", "2", "--space", "space.yaml",
        "--global-batch", "8", "--max-trials", "1", "--budget", "5m", *FAST, *extra,
        "--", mode, *after, cwd=tmp_path, timeout=timeout,
    )  # fmt: skip
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result.returncode, result.stdout + result.stderr


def _probe_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("trial 0:") and "->" in line]
    assert len(lines) == 1, output
    return lines[0]


def test_a_script_that_never_initializes_is_killed_at_the_timeout(tmp_path: Path) -> None:
    code, output = _run(tmp_path, "hang", "--probe-timeout", "20s")
    line = _probe_line(output)
    assert code == 3, output
    assert "did not call deepspeed.initialize within the probe timeout (20 s)" in line
    assert_no_probe_left()


def test_the_script_s_child_processes_end_with_its_probe(tmp_path: Path) -> None:
    """A rank ends without interpreter teardown: the processes the script started (data
    loader workers) are ended with it, not left holding memory while the next probe runs."""
    import psutil

    code, output = _run(tmp_path, "child")
    assert code == 0 and "samples/s" in _probe_line(output), output
    pids = [int(path.read_text()) for path in tmp_path.rglob("child-*.pid")]
    assert len(pids) == 2, pids

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    assert not any(alive(pid) for pid in pids)


def test_a_crash_names_the_line_of_the_script(tmp_path: Path) -> None:
    code, output = _run(tmp_path, "crash")
    line = _probe_line(output)
    assert code == 3, output
    number = next(i for i, t in enumerate(SCRIPT.read_text().splitlines(), 1) if "boom" in t)
    assert f"tiny_script.py line {number} raised ValueError: boom: a bad sample" in line, line
    assert_no_probe_left()


def test_a_script_that_stops_early_says_how_many_steps_the_probe_needs(tmp_path: Path) -> None:
    code, output = _run(tmp_path, "short")
    line = _probe_line(output)
    assert code == 3, output
    # 2 warm-up steps at least, 2 timed; the warm-up goes on while step times have not
    # settled, so a noisy machine may need one more
    found = re.search(r"the script stopped after 3 optimizer steps; the probe needs (\d+)", line)
    assert found and 4 <= int(found.group(1)) <= 6, line
    assert_no_probe_left()


def test_a_script_that_initializes_torch_distributed_itself_works(tmp_path: Path) -> None:
    """... and its loss check takes the config the script builds in code as its reference
    (rank 0 of its probe wrote it down); its float inputs leave the samples uncompared."""
    code, output = _run(tmp_path, "own_init")
    assert code == 0, output
    assert "samples/s" in _probe_line(output)
    assert (tmp_path / "trials" / "tiny_script" / "best" / "launch.sh").exists()
    check = run_cli("verify", "--steps", "2", "--json", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert (
        "against z0 fp32 mb4x1: the config tiny_script.py passes to deepspeed.initialize as "
        "DeepSpeed reads it (z0 fp32 mb4x1)"
    ) in check.stderr
    document = json.loads(check.stdout)
    assert document["reference_rule"] == "base config"
    assert all(run["trace"]["sample_digests"] is None for run in document["runs"])
    assert document["verdict"]["verdict"] != "cannot judge", document["verdict"]["text"]


def test_nccl_on_cpu_ranks_is_one_line(tmp_path: Path) -> None:
    code, output = _run(tmp_path, "nccl")
    assert code == 3, output
    assert "initialises torch.distributed with NCCL" in _probe_line(output)


def test_arguments_the_script_does_not_know(tmp_path: Path) -> None:
    code, output = _run(tmp_path, "train", after=("--warmup",))  # the script has no such flag
    line = _probe_line(output)
    assert code == 3, output
    assert "exited with code 2" in line and "unrecognized arguments: --warmup" in line, line


def test_a_launcher_flag_in_the_scripts_arguments_is_one_line(tmp_path: Path) -> None:
    result = run_cli(
        "run", "--script", str(SCRIPT), "--gpus", "2", "--", "train", "--num_gpus", "2",
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--num_gpus is a launcher flag" in lines[0], result.stderr
    assert not (tmp_path / "trials").exists()
