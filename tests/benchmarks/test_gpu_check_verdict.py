"""The GPU check's verdict: every phase and check ends passed, failed or not verified, and
the exit code tells the three apart (benchmarks/gpu_check/report.py)."""

from __future__ import annotations

from typing import Any

from benchmarks.gpu_check.report import (
    EXIT_FAILED,
    EXIT_NOT_VERIFIED,
    EXIT_PASSED,
    ONE_GPU_CANNOT_SHOW,
    check,
    exit_code,
    render_markdown,
    verdict,
)


def phase(name: str, status: str = "passed", reason: str = "", *checks: dict) -> dict[str, Any]:
    return {"name": name, "status": status, "reason": reason, "seconds": 1.0, "checks": [*checks]}


def wheres(items: list[dict[str, str]]) -> set[str]:
    return {i["where"] for i in items}


def test_a_skipped_phase_is_not_verified_never_passed() -> None:
    v = verdict([phase("env", "passed", "", check("a", True)), phase("oom", "skipped", "--skip")])
    assert v["status"] == "not verified" and v["failed"] == []
    assert "oom" in wheres(v["not_verified"])
    assert exit_code(v["status"]) == EXIT_NOT_VERIFIED


def test_a_phase_out_of_time_and_an_unjudged_check_are_not_verified_with_their_reason() -> None:
    v = verdict(
        [
            phase("memory", "timeout", "ran past 80 s"),
            phase("ops", "passed", "", check("async I/O builds", None, "no libaio")),
        ]
    )
    reasons = {i["where"]: i["reason"] for i in v["not_verified"]}
    assert "ran past 80 s" in reasons["memory"]
    assert reasons["ops: async I/O builds"] == "no libaio"


def test_a_failed_check_or_a_broken_phase_fails_the_whole_check() -> None:
    v = verdict([phase("ops", "failed", "x", check("CPU Adam builds", False, "exit 1"))])
    assert v["status"] == "failed" and wheres(v["failed"]) == {"ops: CPU Adam builds"}
    broken = verdict([phase("env", "failed", "RuntimeError: no GPU")])
    assert broken["failed"] == [{"where": "env", "reason": "RuntimeError: no GPU"}]
    assert exit_code(broken["status"]) == EXIT_FAILED


def test_what_one_gpu_cannot_show_is_always_listed_as_not_verified_and_counted_apart() -> None:
    v = verdict([phase("env", "passed", "", check("a", True))])
    assert {w for w, _ in ONE_GPU_CANNOT_SHOW} <= wheres(v["not_verified"])
    assert v["passed"] == 1 and v["status"] == "not verified"
    assert v["beyond_one_gpu"] == len(ONE_GPU_CANNOT_SHOW) == len(v["not_verified"])
    assert all(i["reason"].startswith("beyond one GPU: ") for i in v["not_verified"])
    whats = " ".join(w for w, _ in ONE_GPU_CANNOT_SHOW)
    assert "2+ ranks" in whats and "NCCL communicator memory" in whats and "spanning" in whats


def test_a_phase_the_run_never_reached_is_not_verified() -> None:
    v = verdict([phase("env", "passed", "", check("a", True))], ["env", "ops"], beyond=())
    assert v["status"] == "not verified"
    assert v["not_verified"] == [{"where": "ops", "reason": "missing: the run did not reach it"}]


def test_the_checks_judged_are_those_passed_or_failed_never_those_not_verified() -> None:
    v = verdict(
        [
            phase("memory", "failed", "x", check("a", True), check("b", False, "20% off")),
            phase(
                "precision_offload", "passed", "", check("c", None, "CPU ranks"), check("d", True)
            ),
        ]
    )
    assert v["judged"] == 3 and v["passed"] == 2 and len(v["failed"]) == 1


def test_a_test_left_outside_the_plan_is_not_verified_with_its_reason() -> None:
    tests = phase("gpu_tests", "passed", "", check("every gpu test in the plan passed", True))
    tests["outside_plan"] = [{"where": "t.py::test_x[4]", "reason": "outside the plan"}]
    v = verdict([tests], beyond=())
    assert v["status"] == "not verified" and v["judged"] == 1
    assert v["not_verified"] == [
        {"where": "gpu_tests: t.py::test_x[4]", "reason": "outside the plan"}
    ]


def test_only_all_passed_exits_zero() -> None:
    assert exit_code("passed") == EXIT_PASSED == 0
    assert exit_code("failed") == EXIT_FAILED == 1
    assert exit_code("not verified") == EXIT_NOT_VERIFIED == 3


def test_the_markdown_shows_the_not_verified_count_and_each_reason() -> None:
    phases = [phase("oom", "skipped", "needs CUDA")]
    report = {
        "date": "2025-01-01",
        "device": None,
        "dry_run": True,
        "command": "benchmarks/gpu_check/gpu_check.sh out --dry-run",
        "versions": {},
        "total_s": 10.0,
        "budget_s": 540.0,
        "phases": phases,
        "verdict": verdict(phases),
    }
    table = render_markdown(report)
    beyond = len(ONE_GPU_CANNOT_SHOW)
    assert (
        f"**Verdict: not verified**: 0 passed, 0 failed (0 checks judged), 1 not verified, and "
        f"{beyond} not verified beyond one GPU (what one GPU cannot show)." in table
    )
    assert "- oom: skipped: needs CUDA" in table


def test_the_exported_configs_training_speed_is_judged_against_the_study() -> None:
    from benchmarks.gpu_check.study_checks import TRAIN_SPEED_TOLERANCE, train_speed_check

    assert train_speed_check(100.0, 100.0)["ok"] is True
    assert train_speed_check(100.0 * (1 - TRAIN_SPEED_TOLERANCE) - 1, 100.0)["ok"] is False
    assert train_speed_check(100.0 * (1 + TRAIN_SPEED_TOLERANCE) + 1, 100.0)["ok"] is False
    assert train_speed_check(None, 100.0)["ok"] is None
    assert train_speed_check(10.0, 100.0, judged=False)["ok"] is None
