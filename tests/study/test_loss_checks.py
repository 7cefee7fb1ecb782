"""A trial's loss check as the study keeps it: stored and read back whole (a NaN loss
included), one entry per trial."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest

from autotune.errors import StorageError
from autotune.study import loss_checks as checks
from tests.support.loss_checks import check


@pytest.fixture
def study(tmp_path: Path) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    return optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db")


def test_checks_are_kept_per_trial_and_read_back_whole(study: optuna.Study) -> None:
    drifting = check(0, [8.301, 8.19, 8.102])
    broken = check(3, [8.3, math.nan, math.nan])
    checks.store(study, drifting)
    checks.store(study, broken)
    reloaded = optuna.load_study(study_name="s", storage=study._storage)
    kept = checks.load_all(reloaded)
    assert sorted(kept) == [0, 3]
    assert kept[0] == drifting and kept[0].verdict.verdict == "drifts"
    again = kept[3]
    assert again.verdict.verdict == "differs" and again.verdict.step == 1
    assert again.runs[2].trace is not None and math.isnan(again.runs[2].trace.losses[1])
    assert checks.load(reloaded, 5) is None


def test_a_stored_check_this_version_cannot_read_is_one_storage_error(study: optuna.Study) -> None:
    study.set_user_attr(checks.LOSS_CHECKS_ATTR, {"0": {"trial": "zero"}})
    with pytest.raises(StorageError, match="stored loss checks"):
        checks.load_all(study)
