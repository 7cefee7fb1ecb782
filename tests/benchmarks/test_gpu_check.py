"""The GPU check (benchmarks/gpu_check.sh): its CPU dry run end to end, so that the check
cannot rot before a GPU runs it, and its judgements on recorded shapes of what the GPU
phases read (autotune status/plan JSON, the memory probes' rows, pytest's summary)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks import prepare_gpu_wheels
from benchmarks.gpu_check import (
    DRY_RUN_SETTINGS,
    gpu_tests_checks,
    memory_checks,
    oom_limit,
    pytest_outcomes,
    render_markdown,
    study_checks,
    train_checks,
)
from tests.support.gpu_check_shapes import (
    judged,
    memory_rows,
    oom_plan,
    passing_inputs,
    study_status,
)

ROOT = Path(__file__).resolve().parents[2]
MiB = 2**20
PHASES = [
    "install",
    "env",
    "ops",
    "memory",
    "precision_offload",
    "gpu_tests",
    "oom",
    "study",
    "train_export",
    "script_deepspeed",
    "script_trainer",
    "study_dit",
    "world_size",
]
NEEDS_CUDA = {"oom", "gpu_tests"}


@pytest.mark.slow
@pytest.mark.nvme_op  # its memory phase probes NVMe offload
def test_the_dry_run_runs_every_phase_it_can_on_cpu_and_reports_all(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_PYTHON": sys.executable}
    script = str(ROOT / "benchmarks" / "gpu_check.sh")
    done = subprocess.run(
        ["bash", script, str(out), "--dry-run", "--work", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1960,
        cwd=tmp_path,
    )
    # a CPU dry run leaves the CUDA-only checks not verified: exit code 3, nothing failed
    assert done.returncode == 3, done.stdout[-4000:] + done.stderr[-4000:]
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["verdict"]["status"] == "not verified" and doc["verdict"]["failed"] == []
    assert all(item["reason"] for item in doc["verdict"]["not_verified"])
    phases = {p["name"]: p for p in doc["phases"]}
    assert list(phases) == PHASES
    for name, phase in phases.items():
        if name in NEEDS_CUDA:
            assert phase["status"] == "skipped" and "needs CUDA" in phase["reason"], phase
        elif name == "study_dit":
            assert phase["status"] == "skipped" and phase["reason"], phase
        else:
            assert phase["status"] == "passed", phase
    memory = phases["memory"]["data"]
    assert sum(r["design"] and r["status"] == "ok" for r in memory["rows"]) >= 16
    assert memory["summary"]["allocated"]["n"] >= 16
    assert phases["train_export"]["data"]["global_steps"] == DRY_RUN_SETTINGS.train_steps
    assert phases["study"]["data"]["study"]["best"]["samples_per_s"] > 0
    # the ranks read their engines: the optimizer that stepped, its host tensors
    measured = [r for r in memory["rows"] if r["status"] == "ok"]
    assert all(r["optimizer"] for r in measured)
    offloaded = [r for r in measured if r["offload_optimizer"] == "cpu"]
    assert offloaded and all(r["offloaded_pageable_bytes"] > 0 for r in offloaded)
    precision = judged(phases["precision_offload"]["checks"])
    assert precision["bf16 runs"] and precision["optimizer offload to CPU runs"]
    assert precision[
        "the probes stepped with the optimizer the ops allow (FusedAdam, else torch's Adam)"
    ]
    for name in ("script_deepspeed", "script_trainer"):  # one probe each, learned, exported
        assert all(c["ok"] for c in phases[name]["checks"]), phases[name]
        learned = phases[name]["data"]["activation_bytes"]
        assert len(learned) == 1 and all(b > 0 for b in learned.values())
    assert doc["verdict"]["beyond_one_gpu"] == 3
    table = (out / "gpu_check.md").read_text()
    assert table.startswith(f"## GPU check, {doc['date']}, ")
    assert "| phase | status | seconds (limit) | result |" in table
    for name in PHASES:
        assert f"| {name} | {phases[name]['status']} |" in table
    assert "benchmarks/gpu_check.sh" in doc["command"] and "--dry-run" in doc["command"]
    assert {"gpu_check.log", "phases.log", "trials.tar.gz"} <= {p.name for p in out.iterdir()}
    assert len(list(out.iterdir())) <= 8  # what a device run brings back


def test_gpu_check_sh_without_an_out_dir_says_how_to_call_it() -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True
    )
    assert done.returncode == 2 and "usage:" in done.stderr


# ---------------------------------------------------------------- recorded shapes
# (each check passing on a run that went right and failing on a doctored one:
# test_gpu_check_doctored.py)


def test_the_oom_limit_lies_between_the_family_that_fits_and_the_next() -> None:
    limit = oom_limit(oom_plan(), overhead_bytes=512 * MiB)
    assert limit["fits"] == "z2 bf16 mb1 opt:cpu ckpt"
    assert limit["limit_bytes"] == ((1400 + 2800) // 2 + 512) * MiB
    flat = {"candidates": [dict(e, device_bytes=1000 * MiB) for e in oom_plan()["candidates"]]}
    with pytest.raises(ValueError, match="no clear gap"):
        oom_limit(flat, overhead_bytes=0)


def test_an_oom_study_that_went_right_names_what_it_ruled_out() -> None:
    function, kwargs = passing_inputs()["oom_checks"]
    checks = function(**kwargs)
    assert all(c["ok"] for c in checks), checks
    ruled = next(c for c in checks if c["name"].startswith("larger micro-batches"))
    assert "z2 bf16 mb2 ckpt" in ruled["detail"] and "recorded infeasible" in ruled["detail"]


def test_memory_targets_are_judged_against_allocated_on_cuda_only() -> None:
    rows = memory_rows()
    rows[3]["leaked_bytes"] = 128 * MiB
    rows[4]["predicted_bytes"] = 1100 * MiB  # +10%: the worst
    on_cpu = judged(memory_checks(rows, "cpu", min_candidates=16))
    assert on_cpu["worst |error| vs allocated <= 8%"] is None
    assert on_cpu["no candidate starts with memory an earlier one left allocated"] is None
    on_cuda = judged(memory_checks(rows, "cuda", min_candidates=16))
    assert on_cuda["worst |error| vs allocated <= 8%"] is False
    assert on_cuda["no candidate starts with memory an earlier one left allocated"] is False


def test_the_dry_run_study_need_not_reach_a_confirmation_round() -> None:
    status = study_status()
    status["confirmation"] = None
    dry = judged(study_checks(status, 0, True, min_probes=1, confirm=False))
    assert dry["confirmation round interleaved the top candidates"] is None


def test_pytest_outcomes_come_from_the_verbose_lines_and_the_short_summary() -> None:
    killed = "tests/test_gpu_paths.py::test_deepspeed_sees_the_limit_not_the_card PASSED [ 11%]\n"
    assert pytest_outcomes(killed) == {
        "tests/test_gpu_paths.py::test_deepspeed_sees_the_limit_not_the_card": "PASSED"
    }
    out = """
PASSED tests/test_gpu_paths.py::test_zero3_builds_under_zero_init_on_the_device
FAILED tests/test_gpu_paths.py::test_fp16_overflow_skipped_steps_are_not_timed - assert 0 >= 1
XFAIL tests/test_gpu_paths.py::test_memory_model_matches_cuda_attention[4] - reason
XPASS tests/test_gpu_paths.py::test_memory_model_matches_cuda_attention[16] reason
SKIPPED [1] tests/test_gpu_paths.py:40: needs a CUDA GPU
"""
    outcomes = pytest_outcomes(out)
    name = "tests/test_gpu_paths.py::test_fp16_overflow_skipped_steps_are_not_timed"
    assert outcomes[name] == "FAILED"
    assert (
        outcomes["tests/test_gpu_paths.py::test_memory_model_matches_cuda_attention[16]"] == "XPASS"
    )
    (checks,) = gpu_tests_checks(outcomes, exit_code=1)
    assert checks["ok"] is False and name in checks["detail"]


def test_the_training_line_is_read() -> None:
    _, data = train_checks("TRAINED global_steps=20 loss=7.1234 samples_per_s=55.5\n", 0, 20)
    assert data == {"global_steps": 20, "loss": 7.1234, "samples_per_s": 55.5}


def test_the_markdown_table_lists_every_phase_with_its_status_and_time() -> None:
    phases = [
        {"name": n, "status": "passed", "seconds": 1.0, "timeout_s": 9, "reason": "", "checks": []}
        for n in PHASES
    ]
    oom = PHASES.index("oom")
    phases[oom] = dict(phases[oom], status="skipped", reason="needs CUDA (x)")
    doc = {
        "date": "2026-12-01",
        "device": "NVIDIA H200",
        "dry_run": False,
        "command": "benchmarks/gpu_check.sh out --wheels .gpu-wheels",
        "versions": {"torch": "2.11.0", "torch_cuda": "13.0", "driver": "580.159.03"},
        "total_s": 470.0,
        "budget_s": 480.0,
        "phases": phases,
    }
    text = render_markdown(doc)
    assert text.startswith("## GPU check, 2026-12-01, NVIDIA H200\n")
    assert "torch 2.11.0 (CUDA 13.0); driver 580.159.03" in text
    assert "| oom | skipped | 1.0 (9) | needs CUDA (x) |" in text
    assert all(f"| {name} |" in text for name in PHASES)


# ---------------------------------------------------------------- the wheels


def test_requirements_follow_the_nodes_interpreter_and_skip_what_it_has(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            "Name: demo",
            "Version: 1.0",
            "Requires-Dist: hjson",
            "Requires-Dist: greenlet; platform_machine == 'aarch64'",
            "Requires-Dist: tomli; python_version < '3.11'",
            "Requires-Dist: pytest; extra == 'test'",
            "Requires-Dist: torch>=2.5",
        ]
    )
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("demo-1.0.dist-info/METADATA", metadata)
    needs = prepare_gpu_wheels.requirements(wheel)
    assert needs == ["hjson", "torch"]
    assert [n for n in needs if prepare_gpu_wheels.carried(n)] == ["hjson"]
    assert prepare_gpu_wheels.carried("typing_extensions")  # pinned recent by pydantic-core
    assert not prepare_gpu_wheels.carried("nvidia-nccl-cu13")
    assert not prepare_gpu_wheels.carried("ray")
    assert prepare_gpu_wheels.carried("accelerate")  # the Trainer script's, not on the node
    assert "accelerate" in prepare_gpu_wheels.ROOTS
