"""A study written by an earlier autotune still continues and still exports the same best.

The database in ``tests/assets/study_c33bdea`` was written at commit c33bdea (its README
says how); ``export/`` holds what ``autotune export`` wrote of it then. A change to the
settings, their stored flags or the trial records must keep both true.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.cli import run_cli

ASSET = Path(__file__).resolve().parents[1] / "assets" / "study_c33bdea"
EXPORTED = ("ds_config.json", "launch.sh", "summary.md")


def _copy_of_the_study(tmp_path: Path) -> str:
    shutil.copy(ASSET / "autotune.db", tmp_path / "autotune.db")
    return f"sqlite:///{tmp_path / 'autotune.db'}"


def _same_files(folder: Path) -> None:
    for name in EXPORTED:
        assert (folder / name).read_text() == (ASSET / "export" / name).read_text(), name


def test_an_old_study_exports_the_same_best(tmp_path: Path) -> None:
    storage = _copy_of_the_study(tmp_path)
    out = tmp_path / "out"
    done = run_cli(
        "export", "--study", "fixture", "--storage", storage, "-o", str(out), "--json",
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert (document["trial"], document["label"], document["backend"]) == (
        1,
        "z0 fp32 mb2x2",
        "deepspeed",
    )
    _same_files(out)


@pytest.mark.slow  # its run builds DeepSpeed's ops where none are built yet (the suite's set-up)
def test_an_old_study_continues_with_its_stored_flags(tmp_path: Path) -> None:
    """The continue takes the stored flags back (the workload, the world size, the sampler,
    the executor, no confirmation round), finds every candidate probed and exports the best
    it had; its files (a space file and the trials folder) are given, as on another host."""
    storage = _copy_of_the_study(tmp_path)
    done = run_cli(
        "run", "--study", "fixture", "--storage", storage, "--quiet",
        "--space", str(ASSET / "space.yaml"), "--trials-dir", str(tmp_path / "trials"),
        cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    taken_back = next(line for line in done.stdout.splitlines() if "with its flags" in line)
    for flag in ("workload", "gpus", "sampler", "executor", "no_confirm", "global_batch"):
        assert flag in taken_back, taken_back
    assert "4 candidate(s) evaluated before" in done.stdout, done.stdout
    assert "best: trial 1 z0 fp32 mb2x2" in done.stdout, done.stdout
    _same_files(tmp_path / "trials" / "fixture" / "best")


def test_an_old_studys_records_read_their_probe_config(tmp_path: Path) -> None:
    """Records before schema version 5 stored the probe's config as ``ds_config``: it reads
    as ``backend_config``, and a record written now stores it under the new key alone."""
    import optuna

    from autotune.study import records

    study = optuna.load_study(study_name="fixture", storage=_copy_of_the_study(tmp_path))
    trial = study.trials[1]
    assert "ds_config" in trial.user_attrs and "backend_config" not in trial.user_attrs
    record = records.read(trial.user_attrs)
    assert record.backend_config == trial.user_attrs["ds_config"]
    assert record.backend_config["train_batch_size"] == 4
    assert "ds_config" not in record.model_dump()
