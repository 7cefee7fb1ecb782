"""The GPU check (benchmarks/gpu_check/gpu_check.sh): its CPU dry run end to end, so that the check
cannot rot before a GPU runs it, and its judgements on recorded shapes of what the GPU
phases read (autotune status/plan JSON, the memory probes' rows, pytest's summary)."""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from benchmarks.gpu_check import (
    DRY_RUN_SETTINGS,
    gpu_tests_checks,
    memory_checks,
    oom_limit,
    prepare_gpu_wheels,
    pytest_outcomes,
    render_markdown,
    study_checks,
    train_checks,
)
from benchmarks.gpu_check._phases import phase_gpu_tests
from benchmarks.gpu_check._run import Phase, Run, Skip
from benchmarks.gpu_check._study_phases import STUDY_SPACE, phase_study, phase_train_export
from benchmarks.gpu_check.report import verdict
from benchmarks.gpu_check.settings import GPU_SETTINGS, NVME_S
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
    "gpu_tests",
    "oom",
    "fsdp2",
    "precision_offload",
    "study",
    "train_export",
    "script_deepspeed",
    "script_trainer",
    "study_dit",
    "world_size",
    "nvme",
]
NEEDS_CUDA = {"oom", "gpu_tests"}
# The checks the CPU dry run judges (passed or failed, not left not verified): what it
# judged when this floor was set. A change that leaves more of them unjudged on CPU ranks
# fails here; raise the floor when a change judges more.
DRY_RUN_JUDGED_FLOOR = 34


@pytest.mark.slow
@pytest.mark.nvme_op  # its nvme phase probes NVMe offload
def test_the_dry_run_runs_every_phase_it_can_on_cpu_and_reports_all(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "GPU_CHECK_PYTHON": sys.executable}
    script = str(ROOT / "benchmarks" / "gpu_check" / "gpu_check.sh")
    done = subprocess.run(
        ["bash", script, str(out), "--dry-run", "--nvme", "--work", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        env=env,
        timeout=DRY_RUN_SETTINGS.total_s + NVME_S[True] + 60,
        cwd=tmp_path,
    )
    # a CPU dry run leaves the CUDA-only checks not verified: exit code 3, nothing failed
    assert done.returncode == 3, done.stdout[-4000:] + done.stderr[-4000:]
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["verdict"]["status"] == "not verified" and doc["verdict"]["failed"] == []
    assert all(item["reason"] for item in doc["verdict"]["not_verified"])
    assert doc["verdict"]["judged"] >= DRY_RUN_JUDGED_FLOOR, doc["verdict"]
    phases = {p["name"]: p for p in doc["phases"]}
    assert list(phases) == PHASES
    for name, phase in phases.items():
        assert phase["seconds"] > 0 or phase["status"] == "skipped", phase  # its wall time
        if name in NEEDS_CUDA:
            assert phase["status"] == "skipped" and "needs CUDA" in phase["reason"], phase
        elif name == "study_dit":
            assert phase["status"] == "skipped" and phase["reason"], phase
        else:
            assert phase["status"] == "passed", phase
    assert_the_memory_phases_judged_on_cpu(phases)
    # the gpu tests outside the plan are named, each not verified
    outside = [
        i["where"] for i in doc["verdict"]["not_verified"] if "outside the plan" in i["reason"]
    ]
    assert any("test_memory_model_matches_cuda_attention" in w for w in outside), outside
    assert phases["train_export"]["data"]["global_steps"] == DRY_RUN_SETTINGS.train_steps
    assert phases["study"]["data"]["study"]["best"]["samples_per_s"] > 0
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
    assert "benchmarks/gpu_check/gpu_check.sh" in doc["command"] and "--dry-run" in doc["command"]
    assert {"gpu_check.log", "phases.log", "trials.tar.gz"} <= {p.name for p in out.iterdir()}
    assert len(list(out.iterdir())) <= 8  # what a device run brings back


def assert_the_memory_phases_judged_on_cpu(phases: dict[str, dict]) -> None:
    """The memory, FSDP2 and NVMe phases on two CPU ranks: every check judged and passed,
    under a limit of 1.3x the largest prediction; the ranks read their engines."""
    memory = phases["memory"]["data"]
    assert sum(r["design"] and r["status"] == "ok" for r in memory["rows"]) >= 16
    assert memory["summary"]["allocated"]["n"] >= 16
    assert all(c["ok"] for c in phases["memory"]["checks"]), phases["memory"]["checks"]
    assert all(r["ranks"] == 2 for r in memory["rows"])
    largest = max(r["predicted_bytes"] for r in memory["rows"])
    assert memory["vram_limit_bytes"] == int(1.3 * largest)
    # FSDP2 on two CPU ranks (gloo): every check judged, its export trained two steps
    fsdp2 = phases["fsdp2"]
    assert fsdp2["checks"] and all(c["ok"] for c in fsdp2["checks"]), fsdp2["checks"]
    assert fsdp2["data"]["train"]["global_steps"] == 2
    assert all(c["ok"] for c in phases["nvme"]["checks"]), phases["nvme"]["checks"]
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


def test_gpu_check_sh_without_an_out_dir_says_how_to_call_it() -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check" / "gpu_check.sh")],
        capture_output=True,
        text=True,
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


def test_memory_targets_are_judged_on_cpu_ranks_too() -> None:
    """The CPU ranks' tracked bytes are what the memory model predicts there: a dry run
    judges its targets (a worst error of 10% fails there as on CUDA), and a leak, within
    the CPU ranks' own tolerance."""
    rows = memory_rows()
    rows[4]["predicted_bytes"] = int(1.1 * rows[4]["allocated_bytes"])  # +10%: the worst
    leak = "no candidate starts with memory an earlier one left allocated"
    for accelerator in ("cpu", "cuda"):
        checks = judged(memory_checks(rows, accelerator, min_candidates=16))
        assert checks["worst |error| vs allocated <= 8%"] is False
        assert checks["median |error| vs allocated <= 3%"] is True
        assert checks[leak] is True
    rows[3]["leaked_bytes"] = 2 * MiB  # an earlier candidate's tensors, still alive
    assert judged(memory_checks(rows, "cpu", min_candidates=16))[leak] is False
    assert judged(memory_checks(rows, "cuda", min_candidates=16))[leak] is True  # cuBLAS's


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
        "command": "benchmarks/gpu_check/gpu_check.sh out --wheels .gpu-wheels",
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


# ---------------------------------------------------------------- what the phases run
# (the GPU's own launchers cannot run here: a Run that records each command instead)


class RecordingRun(Run):
    """A GPU check run whose commands are recorded, not run: each answers as a run that
    went right would (the training line, an empty status document)."""

    def run(self, phase, argv, *, env=None, **kwargs):  # type: ignore[override]
        self.facts.setdefault("commands", []).append((list(argv), dict(env or self.env)))
        if "status" in argv:
            return 0, json.dumps({"trials": [], "best": None})
        return 0, "TRAINED global_steps=20 loss=7.0 samples_per_s=50.0\n"


def recording_run(tmp_path: Path) -> RecordingRun:
    args = argparse.Namespace(full_memory=False, cpu_oom=False)
    run = RecordingRun(
        args=args, settings=GPU_SETTINGS, out=tmp_path, work=tmp_path, console=io.StringIO()
    )
    run.env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"), "PATH": "/bin"}
    run.facts["accelerator"] = "cuda"
    return run


def test_the_exported_config_trains_with_the_ops_the_ops_phase_built(tmp_path: Path) -> None:
    run = recording_run(tmp_path)
    export = {"folder": str(tmp_path / "best"), "workload": "gpt2", "checkpointing": False}
    run.facts["exports"] = {"study": {**export, "samples_per_s": 50.0}}
    phase_train_export(run, Phase(name="train_export"))
    ((argv, env),) = run.facts["commands"]
    assert argv[:2] == ["bash", str(tmp_path / "best" / "launch.sh")]
    # autotune's op folder, where the probes' FusedAdam is built: not a fresh one
    assert "--autotune-ops" in argv
    assert env["TORCH_EXTENSIONS_DIR"] == run.env["TORCH_EXTENSIONS_DIR"]
    assert env["LAUNCHER"] == "deepspeed"


def test_the_study_on_a_gpu_searches_the_default_space_pinned_to_deepspeed(
    tmp_path: Path,
) -> None:
    from autotune.space import load_space

    run = recording_run(tmp_path)
    phase = Phase(name="study", timeout_s=GPU_SETTINGS.timeouts["study"])
    phase.deadline = time.monotonic() + phase.timeout_s
    phase_study(run, phase)
    argv = run.facts["commands"][0][0]
    assert argv[argv.index("--space") + 1] == str(STUDY_SPACE)
    pinned = load_space(str(STUDY_SPACE)).model_dump()
    default = load_space("default").model_dump()
    assert pinned["backend"] == ["deepspeed"] and "fsdp2" in default["backend"]
    assert {k for k in default if default[k] != pinned[k]} == {"backend"}


def test_the_plans_gpu_tests_are_those_of_the_shared_launches() -> None:
    """Every test of the module fixture's launches carries the plan's marker; a test that
    launches probes of its own does not (the check lists it not verified)."""
    tree = ast.parse((ROOT / "tests" / "integration" / "test_gpu_paths.py").read_text())
    tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]

    def in_plan(test: ast.FunctionDef) -> bool:
        return any(ast.unparse(d) == "IN_GPU_CHECK_PLAN" for d in test.decorator_list)

    marked = {n.name for n in tests if in_plan(n)}
    shared = {n.name for n in tests if "runs" in [a.arg for a in n.args.args]}
    own_launch = {n.name for n in tests if "launch_probes" in ast.unparse(n)}
    assert shared and shared <= marked
    assert own_launch and not own_launch & marked


def test_the_gpu_tests_outside_the_plan_are_named_not_verified(tmp_path: Path) -> None:
    """The gpu_tests phase collects the gpu tests for real (on CPU it then skips): those
    without the plan's marker are each listed not verified, with the reason."""
    run = Run(
        args=argparse.Namespace(),
        settings=DRY_RUN_SETTINGS,
        out=tmp_path,
        work=tmp_path,
        console=io.StringIO(),
    )
    run.env = dict(os.environ)
    phase = Phase(name="gpu_tests", timeout_s=300)
    phase.deadline = time.monotonic() + phase.timeout_s
    with pytest.raises(Skip, match=r"needs CUDA \(7 gpu tests in the plan collected, 2 outside"):
        phase_gpu_tests(run, phase)
    outside = [item["where"] for item in phase.outside_plan]
    assert outside == [
        "tests/integration/test_gpu_paths.py::test_memory_model_matches_cuda_attention[4]",
        "tests/integration/test_gpu_paths.py::test_memory_model_matches_cuda_attention[16]",
    ]
    v = verdict([{"name": "gpu_tests", "status": "skipped", "reason": "needs CUDA",
                  "checks": [], "outside_plan": phase.outside_plan}], beyond=())  # fmt: skip
    assert {i["where"] for i in v["not_verified"]} >= {f"gpu_tests: {w}" for w in outside}
