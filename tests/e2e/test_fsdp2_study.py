"""One study over DeepSpeed and FSDP2 on 2 CPU ranks: both are probed, the export is the
decided best's backend's, every view compares the two, and an FSDP2 export trains unedited
through its launch.sh."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.study import best, records
from tests.support.cli import run_cli
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

SPACE = """
backend: [deepspeed, fsdp2]
precision: [fp32]
zero_stage: [0]
micro_batch_size: [8]
fsdp:
  reshard_after_forward: [true]
  cpu_offload: [false]
"""


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("both-backends")
    (workdir / "space.yaml").write_text(SPACE)
    result = run_cli(
        *["run", "--workload", "gpt-tiny", "--gpus", "2", "--global-batch", "16"],
        *["--space", "space.yaml", "--budget", "3m", "--warmup-steps", "1"],
        *["--timed-steps", "3", "--max-timed-steps", "6", "--seed", "0"],
        cwd=workdir,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (workdir / "run.log").write_text(result.stdout)
    return workdir


def _study(workdir: Path) -> optuna.Study:
    storage = f"sqlite:///{workdir}/trials/autotune.db"
    return optuna.load_study(study_name="gpt-tiny", storage=storage)


def test_the_export_is_the_best_backends_and_the_views_compare_both(study_dir: Path) -> None:
    study = _study(study_dir)
    trials = [t for t in records.views(study) if t.is_evaluation]
    assert {t.candidate.backend for t in trials if t.feasible} == {"deepspeed", "fsdp2"}
    decided = best.of_study(study)
    assert decided is not None
    winner = records.views(study)[decided.trial].candidate.backend
    folder = study_dir / "trials" / "gpt-tiny" / "best"
    config_file = {"deepspeed": "ds_config.json", "fsdp2": "fsdp2_config.json"}[winner]
    assert (folder / config_file).is_file()
    assert f"exported: {folder / config_file} (" in (study_dir / "run.log").read_text()
    summary = (folder / "summary.md").read_text()
    assert "## DeepSpeed or FSDP2" in summary
    assert "- DeepSpeed: z0 fp32 mb8x1" in summary and "- FSDP2: fsdp2 fp32 mb8x1" in summary
    status = run_cli("status", cwd=study_dir, timeout=120)
    assert status.returncode == 0, status.stderr
    assert "the faster backend" in status.stdout and "'s speed at" in status.stdout
    assert "Objective, world sizes and backends" in (folder / "report.html").read_text()


def test_an_fsdp2_export_trains_unedited_through_launch_sh(study_dir: Path) -> None:
    study = _study(study_dir)
    (fsdp2,) = [
        t for t in records.views(study) if t.is_evaluation and t.candidate.backend == "fsdp2"
    ]
    out = study_dir / "fsdp2-export"
    result = run_cli("export", "--trial", str(fsdp2.number), "-o", str(out), cwd=study_dir)
    assert result.returncode == 0, result.stderr
    names = {p.name for p in out.iterdir()}
    assert names == {"fsdp2_config.json", "accelerate_config.yaml", "launch.sh", "summary.md"}
    assert "fully_shard(block, **policy)" in (out / "summary.md").read_text()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    train = subprocess.run(
        [str(out / "launch.sh"), str(ROOT / "tests" / "assets" / "train_with_fsdp2.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=study_dir,
    )  # CPU ranks: torchrun, the script calls fully_shard from fsdp2_config.json
    output = train.stdout + train.stderr
    assert train.returncode == 0, output[-3000:]
    assert (
        output.count("TRAINED fsdp2=True units=3 param_dtype=torch.float32 offload=OffloadPolicy")
        == 1
    ), output[-3000:]
