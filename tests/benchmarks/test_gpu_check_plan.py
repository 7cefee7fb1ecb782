"""The GPU check's time plan adds up: each phase's limit from one table, their sum within
the budget, no phase under what its own constants need, the phases in the order of what
they prove, and a re-plan from an earlier report's wall times never past the budget
(benchmarks/gpu_check/settings.py)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.gpu_check._driver import LEFTOVER_GRACE_S, main, phase_limit
from benchmarks.gpu_check._phases import PHASES
from benchmarks.gpu_check.settings import (
    BEYOND_BUDGET,
    DRY_RUN_SETTINGS,
    GPU_BUDGET_S,
    GPU_SETTINGS,
    PLAN_MARGIN,
    PLAN_PAD_S,
    phase_needs,
    plan_lines,
    plan_problems,
    planned_s,
    replan,
)

ORDER = [name for name, _ in PHASES]


# not "gpu": a test with that keyword is skipped without CUDA (tests/conftest.py)
@pytest.mark.parametrize(
    "settings", [GPU_SETTINGS, DRY_RUN_SETTINGS], ids=["gpu_settings", "dry_run_settings"]
)
def test_the_time_plan_adds_up(settings) -> None:
    assert list(settings.timeouts) == ORDER
    assert planned_s(settings) <= settings.total_s
    for name, need in phase_needs(settings).items():
        assert settings.timeouts[name] >= need, name
    assert plan_problems(settings) == []


def test_the_budget_holds_the_install_and_every_planned_phase_in_9_minutes() -> None:
    assert GPU_SETTINGS.total_s == GPU_BUDGET_S <= 9 * 60
    assert GPU_SETTINGS.timeouts["install"] > 0  # inside the budget, not before it
    assert planned_s(GPU_SETTINGS) <= GPU_BUDGET_S
    # nothing beyond the budget is planned on one GPU by default
    assert all(GPU_SETTINGS.timeouts[name] == 0 for name in BEYOND_BUDGET)


def test_the_phases_run_in_the_order_of_what_they_prove() -> None:
    position = ORDER.index
    # CUDA's memory truths (peak, overhead, limit, out-of-memory) first, then FSDP2, then
    # precision and offload, then the study and its export, the scripts after
    assert position("memory") < position("gpu_tests") < position("oom") < position("fsdp2")
    assert position("fsdp2") < position("precision_offload") < position("study")
    assert position("study") < position("train_export") < position("script_deepspeed")
    assert ORDER[-1] == "nvme"  # optional, beyond the budget


def test_a_plan_that_does_not_add_up_is_reported() -> None:
    over = dataclasses.replace(GPU_SETTINGS, total_s=planned_s(GPU_SETTINGS) - 1)
    assert any("add up to" in p for p in plan_problems(over))
    short = dataclasses.replace(GPU_SETTINGS, timeouts={**GPU_SETTINGS.timeouts, "study": 30})
    assert plan_problems(short) == ["study: 30 s, under its 80 s"]
    assert "plan does not add up: study: 30 s, under its 80 s" in plan_lines(short)
    script = dataclasses.replace(
        DRY_RUN_SETTINGS, timeouts={**DRY_RUN_SETTINGS.timeouts, "script_trainer": 140}
    )
    assert plan_problems(script) == ["script_trainer: 140 s, under its 150 s"]


def test_the_plan_is_printed_with_every_phase_and_the_sum() -> None:
    lines = plan_lines(GPU_SETTINGS)
    assert lines[0] == "plan: install 35 s"
    assert "plan: script_trainer in the time the plan leaves (at least 45 s)" in lines
    assert "plan: study_dit 0 s (not in the plan: not verified)" in lines
    planned = sum(GPU_SETTINGS.timeouts.values())
    assert lines[-1] == (
        f"plan: {planned} s and {GPU_SETTINGS.between_phases_s} s between phases, "
        f"{planned + GPU_SETTINGS.between_phases_s} s of the {GPU_BUDGET_S} s budget"
    )


def test_a_phase_in_the_time_left_gets_what_the_later_phases_leave() -> None:
    settings = dataclasses.replace(GPU_SETTINGS, timeouts={**GPU_SETTINGS.timeouts, "nvme": 60})
    run = SimpleNamespace(settings=settings, started=time.monotonic(), left_s=lambda: 200.0)
    assert phase_limit(run, "study") == GPU_SETTINGS.timeouts["study"]  # planned: its limit
    # what is left, less the later phases' limits (NVMe's 60 s) and the last grace
    assert phase_limit(run, "script_trainer") == 200 - 60 - LEFTOVER_GRACE_S


# ---------------------------------------------------------------- the re-plan


def report_phases(seconds: dict[str, float], status: str = "passed") -> list[dict]:
    """A doctored report's phases: each named phase ran for its seconds; the rest skipped."""
    return [
        {"name": name, "status": status if name in seconds else "skipped",
         "seconds": seconds.get(name, 0.0), "checks": []}
        for name in ORDER
    ]  # fmt: skip


def test_the_plan_is_remade_from_an_earlier_reports_wall_times() -> None:
    measured = {"install": 20.0, "env": 8.0, "ops": 40.0, "memory": 50.0, "gpu_tests": 30.0}
    measured.update(fsdp2=30.0, train_export=12.0, script_deepspeed=25.0, script_trainer=30.0)
    plan = replan(GPU_SETTINGS, report_phases(measured))
    for name, seconds in measured.items():
        expected = max(5, int(-(-(seconds * (1 + PLAN_MARGIN) + PLAN_PAD_S) // 1)))
        if name.startswith("script"):  # at least what a script study needs
            expected = max(expected, 45)
        assert plan.timeouts[name] == expected, name
    # a study fills its limit: its wall time is no measure of its need, its limit is kept
    assert plan.timeouts["oom"] == GPU_SETTINGS.timeouts["oom"]
    assert plan.timeouts["study"] == GPU_SETTINGS.timeouts["study"]
    # the scripts ran, so they are planned now; never above the budget in all
    assert plan.if_time_left == ()
    assert planned_s(plan) <= GPU_BUDGET_S == plan.total_s
    assert plan_problems(plan) == []


def test_a_remade_plan_past_the_budget_leaves_out_the_last_phases() -> None:
    slow = {name: 50.0 for name in ORDER}
    plan = replan(GPU_SETTINGS, report_phases(slow))
    assert planned_s(plan) <= GPU_BUDGET_S
    dropped = [name for name in ORDER if not plan.timeouts[name]]
    kept = [name for name in ORDER if plan.timeouts[name]]
    assert kept == ORDER[: len(kept)] and kept[:4] == ["install", "env", "ops", "memory"]
    assert "script_trainer" in dropped and "script_trainer" in plan.if_time_left
    assert plan_problems(plan) == []


def test_a_phase_that_ran_out_of_time_is_given_more_and_a_broken_one_keeps_its_limit() -> None:
    phases = report_phases({"memory": 85.0}, status="timeout")
    env = next(p for p in phases if p["name"] == "env")
    env.update(status="failed", seconds=0.5)  # broken by an error, no check failed
    plan = replan(GPU_SETTINGS, phases)
    assert plan.timeouts["memory"] > GPU_SETTINGS.timeouts["memory"]
    assert plan.timeouts["env"] == GPU_SETTINGS.timeouts["env"]  # an error says nothing


def test_plan_from_prints_the_remade_plan_and_refuses_a_bad_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "gpu_check.json"
    report.write_text(json.dumps({"phases": report_phases({"ops": 20.0})}))
    assert main([str(tmp_path / "out"), "--plan", "--plan-from", str(report)]) == 0
    assert "plan: ops 31 s" in capsys.readouterr().out.splitlines()
    report.write_text("{}")
    assert main([str(tmp_path / "out"), "--plan", "--plan-from", str(report)]) == 2
    assert "not a gpu_check.json report" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
