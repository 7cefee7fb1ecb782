"""The budget counts the command's wall time: a run's set-up is charged, a one-time build of
DeepSpeed's ops is not."""

from __future__ import annotations

import time

import optuna
import pytest

from autotune.budget import BudgetClock, BudgetRecord, read_budget
from tests.test_confirm import ScriptedExecutor

SPACE = (
    "precision: [fp32]\nzero_stage: [0, 1]\noffload_optimizer: [none]\noffload_param: [none]\n"
    "micro_batch_size: [8]\ngradient_accumulation_steps: [1]\nactivation_checkpointing: [false]\n"
)


def test_the_clock_runs_from_its_origin_never_from_the_future() -> None:
    clock = BudgetClock(BudgetRecord(total_s=100.0, spent_s=10.0), None)
    assert clock.elapsed_s == 0.0 and clock.left_s == pytest.approx(90.0)
    clock.start(time.monotonic() - 30.0)
    assert clock.elapsed_s == pytest.approx(30.0, abs=1.0)
    assert clock.spent_s == pytest.approx(40.0, abs=1.0)
    later = BudgetClock(BudgetRecord(total_s=100.0), None)
    later.start(time.monotonic() + 50.0)  # an origin not reached yet counts from now
    assert later.elapsed_s < 1.0


@pytest.mark.parametrize("ops_build_s", [0.0, 25.0])
def test_a_runs_set_up_is_charged_and_an_op_build_is_not(tmp_path, monkeypatch, ops_build_s):
    """ScriptedExecutor stands in for the probes (they take no time here): what the study
    spent is the set-up before the tuner started, less the op build."""
    from autotune.plan import plan_run
    from autotune.settings import RunSettings
    from autotune.tuner import Tuner

    (tmp_path / "space.yaml").write_text(SPACE)
    settings = RunSettings.build(
        workload="gpt-tiny",
        gpus=2,
        trials_dir=tmp_path / "trials",
        storage_url=f"sqlite:///{tmp_path}/t.db",
        space=str(tmp_path / "space.yaml"),
        budget_s=600,
        max_trials=2,
        confirm=False,
    )
    scripted = ScriptedExecutor({"z0 fp32 mb8x1": [100.0], "z1 fp32 mb8x1": [90.0]})
    set_up_s = 40.0  # the command started this long before the tuner
    tuner = Tuner(
        plan_run(settings),
        executor_factory=lambda plan: scripted,
        started_s=time.monotonic() - set_up_s,
    )

    def built_ops() -> float:
        return ops_build_s  # what a first run's compile of the ops took

    monkeypatch.setattr(tuner, "_prepare_ops", built_ops)
    summary = tuner.run()
    assert summary.export_dir
    study = optuna.load_study(study_name="gpt-tiny", storage=f"sqlite:///{tmp_path}/t.db")
    spent_s = read_budget(study).spent_s
    assert set_up_s - ops_build_s <= spent_s < set_up_s - ops_build_s + 15.0
