"""The flags a continue takes back from a study (``autotune.study.stored_run_flags``): a
memory limit the study took from its host comes back as the limit it was measured under."""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune.study import stored_run_flags
from autotune.study.storage import CONFIG_ATTR, FLAGS_ATTR


def _study(tmp_path: Path, vram: str, limit_bytes: int) -> str:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    study.set_user_attr(FLAGS_ATTR, {"workload": "gpt-tiny", "vram": vram})
    study.set_user_attr(CONFIG_ATTR, {"vram_limit_bytes": limit_bytes})
    return url


def test_an_automatic_limit_comes_back_as_the_measured_one(tmp_path: Path) -> None:
    """A CPU host's memory differs by pages between machines (and kernels): the study keeps
    the limit its probes were screened under, so a continue elsewhere is not refused."""
    url = _study(tmp_path, "auto", 25_276_194_816)
    assert stored_run_flags(url, "s") == {"workload": "gpt-tiny", "vram": "25276194816"}


def test_a_limit_given_at_the_start_comes_back_as_given(tmp_path: Path) -> None:
    url = _study(tmp_path, "80GiB", 80 * 2**30)
    assert stored_run_flags(url, "s")["vram"] == "80GiB"
    assert stored_run_flags(url, "other") == {}
