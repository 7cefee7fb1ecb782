"""The GPU check's time plan adds up: each phase's limit from one table, their sum within
the budget, no phase under what its own constants need (benchmarks/gpu_check/settings.py)."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.gpu_check._phases import PHASES
from benchmarks.gpu_check.settings import (
    DRY_RUN_SETTINGS,
    GPU_BUDGET_S,
    GPU_SETTINGS,
    phase_needs,
    plan_lines,
    plan_problems,
)


# not "gpu": a test with that keyword is skipped without CUDA (tests/conftest.py)
@pytest.mark.parametrize(
    "settings", [GPU_SETTINGS, DRY_RUN_SETTINGS], ids=["gpu_settings", "dry_run_settings"]
)
def test_the_time_plan_adds_up(settings) -> None:
    assert list(settings.timeouts) == [name for name, _ in PHASES]
    assert sum(settings.timeouts.values()) + settings.between_phases_s <= settings.total_s
    for name, need in phase_needs(settings).items():
        assert settings.timeouts[name] >= need, name
    assert plan_problems(settings) == []


def test_the_gpu_budget_is_at_most_9_minutes() -> None:
    assert GPU_SETTINGS.total_s == GPU_BUDGET_S <= 9 * 60


def test_a_plan_that_does_not_add_up_is_reported() -> None:
    over = dataclasses.replace(GPU_SETTINGS, total_s=GPU_BUDGET_S - 1)
    assert any("add up to" in p for p in plan_problems(over))
    no_room = dataclasses.replace(GPU_SETTINGS, between_phases_s=GPU_SETTINGS.between_phases_s + 1)
    assert any("between phases add up to" in p for p in plan_problems(no_room))
    short = dataclasses.replace(GPU_SETTINGS, timeouts={**GPU_SETTINGS.timeouts, "study": 30})
    assert plan_problems(short) == ["study: 30 s, under its 85 s"]
    assert "plan does not add up: study: 30 s, under its 85 s" in plan_lines(short)
    script = dataclasses.replace(
        GPU_SETTINGS, timeouts={**GPU_SETTINGS.timeouts, "script_trainer": 40}
    )
    assert plan_problems(script) == ["script_trainer: 40 s, under its 45 s"]


def test_the_plan_is_printed_with_every_phase_and_the_sum() -> None:
    lines = plan_lines(GPU_SETTINGS)
    assert lines[0] == "plan: install 40 s"
    assert "plan: script_trainer 45 s" in lines
    assert "plan: study_dit 0 s (not in the plan: not verified)" in lines
    planned = GPU_BUDGET_S - GPU_SETTINGS.between_phases_s
    assert lines[-1] == (
        f"plan: {planned} s and {GPU_SETTINGS.between_phases_s} s between phases, "
        f"{GPU_BUDGET_S} s of the {GPU_BUDGET_S} s budget"
    )
