"""The three ways in (README, "Tune your own model"), each a short real study through the
CLI, as a user runs it from the example's folder: a plain DeepSpeed script through a
project file written by `autotune init` (so `autotune run` alone is the command), a Hugging
Face Trainer script, and a Workload factory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "examples"
# Short probes, two of them, no confirmation round: each study stays near a minute here.
SHORT = [
    "--max-trials", "2", "--budget", "3m", "--executor", "local", "--no-confirm",
    "--warmup-steps", "1", "--timed-steps", "2", "--max-timed-steps", "4",
]  # fmt: skip
SPACE = "precision: [fp32, bf16]\nzero_stage: [0, 1]\nmicro_batch_size: [4, 8]\n"


def _copy(name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(EXAMPLES / name, folder)
    (folder / "space.yaml").write_text(SPACE)
    return folder


def _exported(folder: Path, study: str) -> str:
    best = folder / "trials" / study / "best"
    assert (best / "ds_config.json").exists() and (best / "summary.md").exists()
    return (best / "launch.sh").read_text()


def test_deepspeed_script_through_a_project_file(tmp_path: Path) -> None:
    folder = _copy("vision_deepspeed", tmp_path)
    init = run_cli(
        "init", "train.py", "--gpus", "2", "--",
        "--deepspeed", "--deepspeed_config", "ds_config.json", "--epochs", "50", cwd=folder,
    )  # fmt: skip
    assert init.returncode == 0, init.stdout + init.stderr
    assert "global_batch: 32" in (folder / "autotune.yaml").read_text()  # the config's batch
    result = run_cli("run", "--gpus", "2", "--space", "space.yaml", *SHORT, cwd=folder)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "project file: autotune.yaml" in result.stdout
    launch = _exported(folder, "train")
    assert '--deepspeed_config "$CONFIG"' in launch and "--epochs 50" in launch
    # a script rank measures its process's peak resident memory as a built-in one does
    summary = (folder / "trials" / "train" / "best" / "summary.md").read_text()
    assert "- Host memory per rank process, peak resident memory (kernel high-water mark): " in (
        summary
    )
    # other world sizes from the script's probes: its model as the ranks reported it
    plan = run_cli("plan", "--study", "train", "--gpus", "1,2,4", "--json", cwd=folder)
    assert plan.returncode == 0, plan.stdout + plan.stderr
    rows = json.loads(plan.stdout)["rows"]
    kinds = {(r["gpus"], r["samples_per_s_kind"]) for r in rows}
    assert {(2, "measured"), (1, "predicted"), (4, "predicted")} <= kinds, kinds
    assert all(r["predicted_samples_per_s"] > 0 for r in rows)
    tokens = run_cli("plan", "--study", "train", "--gpus", "4", "--train-tokens", "1B",
                     cwd=folder)  # fmt: skip
    assert tokens.returncode == 2 and "give --train-samples" in tokens.stderr, tokens.stderr


def test_hugging_face_trainer_script(tmp_path: Path) -> None:
    folder = _copy("hf_trainer", tmp_path)
    result = run_cli(
        "run", "--script", "train.py", "--gpus", "2", "--space", "space.yaml", *SHORT, "--",
        "--deepspeed", "ds_config.json", "--output_dir", "out", "--max_steps", "1000",
        "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
        "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true",
        "--logging_strategy", "no", cwd=folder,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    launch = _exported(folder, "train")
    assert '--deepspeed "$CONFIG"' in launch and "--per_device_train_batch_size" in launch
    summary = (folder / "trials" / "train" / "best" / "summary.md").read_text()
    assert "## Your script" in summary and "Hugging Face Trainer" in summary


def test_workload_factory(tmp_path: Path) -> None:
    folder = _copy("workload", tmp_path)
    result = run_cli(
        "run", "--workload", "mlp.py:make", "--gpus", "2", "--space", "space.yaml", *SHORT,
        cwd=folder,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "error" not in result.stdout  # bf16 probes get bf16 inputs
    _exported(folder, "mlp")  # named after the workload, not its factory
