"""A user's script probed in warm ranks (``autotune run --script``): its ``__main__`` run
again in the same processes for each candidate, the interpreter, imports and process group
paid once; a script that cannot run twice in one process falls back to cold launches with
one line, every probe still measured."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tests.e2e.faults.conftest import assert_no_probe_left
from tests.support.cli import run_cli
from tests.support.paths import ASSETS

pytestmark = pytest.mark.slow

SCRIPT = ASSETS / "tiny_script.py"
SPACE = "precision: [fp32]\nzero_stage: [0, 1]\nmicro_batch_size: [2, 4]\n"
FAST = [
    "--warmup-steps", "1", "--timed-steps", "2", "--max-timed-steps", "2",
    "--no-early-stop", "--no-confirm", "--sampler", "grid",
]  # fmt: skip


def _study(tmp_path: Path, mode: str, executor: str = "local") -> tuple[str, list[dict]]:
    (tmp_path / "space.yaml").write_text(SPACE)
    result = run_cli(
        "run", "--script", str(SCRIPT), "--gpus", "2", "--space", "space.yaml",
        "--global-batch", "8", "--max-trials", "3", "--budget", "5m", *FAST,
        "--executor", executor, "--", mode, cwd=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in output, output
    study = optuna.load_study(
        study_name="tiny_script", storage=f"sqlite:///{tmp_path}/trials/autotune.db"
    )
    trials = [t.user_attrs for t in study.trials if "probe_wall_s" in t.user_attrs]
    return output, trials


@pytest.mark.parametrize(
    ("mode", "executor"), [("train", "local"), ("own_init", "local"), ("train", "ray")]
)
def test_a_scripts_later_probes_run_in_its_warm_ranks(
    tmp_path: Path, mode: str, executor: str
) -> None:
    """``own_init``: the script calls ``init_process_group`` itself, which the warm ranks'
    kept group answers on every run after the first; ``ray``: the warm group inside a Ray
    actor's slot, as the default executor runs it."""
    output, trials = _study(tmp_path, mode, executor)
    assert [t["status"] for t in trials] == ["ok"] * 3, output
    assert [t.get("probe_cold_start", False) for t in trials] == [True, False, False], output
    assert "cold launches from here on" not in output
    assert_no_probe_left()


def test_a_script_that_cannot_run_twice_falls_back_to_cold_launches(tmp_path: Path) -> None:
    output, trials = _study(tmp_path, "once")
    assert [t["status"] for t in trials] == ["ok"] * 3, output  # never measured wrong
    assert [t.get("probe_cold_start", False) for t in trials] == [True, True, True], output
    lines = [line for line in output.splitlines() if "cold launches from here on" in line]
    assert len(lines) == 1 and lines[0].startswith("trial 1:"), output
    assert "tiny_script.py cannot run twice in one process" in lines[0]
    assert_no_probe_left()
