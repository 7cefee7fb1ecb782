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
from typing import Any

import pytest

from benchmarks import prepare_gpu_wheels
from benchmarks.gpu_check import (
    DRY_RUN_SETTINGS,
    gpu_tests_checks,
    memory_checks,
    oom_checks,
    oom_limit,
    precision_offload_checks,
    pytest_outcomes,
    render_markdown,
    study_checks,
    train_checks,
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
    "study_dit",
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
        timeout=1800,
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


def candidate(precision: str, stage: int, mb: int, optimizer: str = "none") -> dict[str, Any]:
    return {
        "precision": precision,
        "zero_stage": stage,
        "offload_optimizer": optimizer,
        "offload_optimizer_ratio": 1.0,
        "offload_param": "none",
        "micro_batch_size": mb,
        "gradient_accumulation_steps": 2 // mb,
        "data_parallel_size": 1,
        "activation_checkpointing": True,
    }


def label(c: dict[str, Any]) -> str:
    opt = " opt:cpu" if c["offload_optimizer"] == "cpu" else ""
    return f"z{c['zero_stage']} {c['precision']} mb{c['micro_batch_size']}{opt} ckpt"


FAMILIES = [("bf16", 0, "none"), ("bf16", 2, "none"), ("bf16", 2, "cpu")]
NEED_MIB = {0: 2500, 2: 2500}  # ZeRO-0 and ZeRO-2 without offload: model states on the GPU


def oom_plan() -> dict[str, Any]:
    candidates = []
    for precision, stage, optimizer in FAMILIES:
        for mb in (1, 2):
            c = candidate(precision, stage, mb, optimizer)
            need = 1100 if optimizer == "cpu" else NEED_MIB[stage]
            candidates.append(
                {"label": label(c), "candidate": c, "device_bytes": (need + 300 * mb) * MiB}
            )
    return {"candidates": candidates}


def trial(number: int, c: dict[str, Any], status: str, **extra: Any) -> dict[str, Any]:
    return {
        "number": number,
        "label": label(c),
        "candidate": c,
        "status": status,
        "error": extra.pop("error", ""),
        "pruned_by": extra.pop("pruned_by", ""),
        "trial_dir": f"/trials/trial-{number:04d}",
        **extra,
    }


CUDA_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 384.00 MiB"


def oom_study() -> dict[str, Any]:
    """What a grid study under a limit between ZeRO-2 with offload and ZeRO-0 records."""
    z0, z2, z2cpu = ([candidate(p, s, mb, o) for mb in (1, 2)] for p, s, o in FAMILIES)
    return {
        "trials": [
            trial(0, z0[0], "oom", error=f"rank 0: {CUDA_OOM}"),
            trial(1, z0[1], "pruned", pruned_by="oom at micro-batch 1"),
            trial(2, z2[0], "oom", error=f"rank 0: {CUDA_OOM}"),
            trial(3, z2cpu[0], "ok"),
            trial(4, z2cpu[1], "ok"),
        ]
    }


CLEAN = {
    3: {"leaked_bytes": 0, "device_overhead_bytes": 600 * MiB},
    4: {"leaked_bytes": 0, "device_overhead_bytes": 600 * MiB},
}


def judged(checks: list[dict[str, Any]]) -> dict[str, bool | None]:
    return {c["name"]: c["ok"] for c in checks}


def test_the_oom_limit_lies_between_the_family_that_fits_and_the_next() -> None:
    limit = oom_limit(oom_plan(), overhead_bytes=512 * MiB)
    assert limit["fits"] == "z2 bf16 mb1 opt:cpu ckpt"
    assert limit["limit_bytes"] == ((1400 + 2800) // 2 + 512) * MiB
    flat = {"candidates": [dict(e, device_bytes=1000 * MiB) for e in oom_plan()["candidates"]]}
    with pytest.raises(ValueError, match="no clear gap"):
        oom_limit(flat, overhead_bytes=0)


def test_an_oom_study_that_went_right_passes_every_check() -> None:
    checks = oom_checks(
        oom_study(), oom_plan(), CLEAN, accelerator="cuda", exit_code=0, leftovers=[]
    )
    assert all(c["ok"] for c in checks), checks
    ruled = next(c for c in checks if c["name"].startswith("larger micro-batches"))
    assert "z2 bf16 mb2 ckpt" in ruled["detail"] and "recorded infeasible" in ruled["detail"]


def test_an_oom_study_shows_each_way_it_can_go_wrong() -> None:
    study = oom_study()
    z0_mb2 = study["trials"][1]
    study["trials"][1] = dict(z0_mb2, status="ok", pruned_by="")  # probed after its oom
    zombie = {3: {"leaked_bytes": 0, "device_overhead_bytes": 2600 * MiB}, 4: CLEAN[4]}
    checks = judged(
        oom_checks(
            study, oom_plan(), zombie, accelerator="cuda", exit_code=3, leftovers=["77 torchrun"]
        )
    )
    assert checks["a probe over the limit is recorded oom with CUDA's message"]
    assert (
        checks["the study went on after the out-of-memory and exported a fitting config"] is False
    )
    assert checks["no larger micro-batch of an out-of-memory family probed after it"] is False
    assert checks["no memory or process left behind by the out-of-memory probe"] is False
    cpu_text = {
        "trials": [dict(t, error="rank 0: rank tensor memory ...") for t in oom_study()["trials"]]
    }
    cuda = oom_checks(cpu_text, oom_plan(), CLEAN, accelerator="cuda", exit_code=0, leftovers=[])
    assert judged(cuda)["a probe over the limit is recorded oom with CUDA's message"] is False


def memory_row(precision: str, stage: int, predicted: int, allocated: int, **extra: Any) -> dict:
    return {
        "label": f"z{stage} {precision}",
        "design": True,
        "precision": precision,
        "offload_optimizer": "none",
        "offload_param": "none",
        "status": "ok",
        "error": "",
        "predicted_bytes": predicted,
        "allocated_bytes": allocated,
        "reserved_bytes": int(allocated * 1.1),
        "leaked_bytes": 0,
        **extra,
    }


def test_memory_targets_are_judged_against_allocated_on_cuda_only() -> None:
    rows = [memory_row("bf16", s % 4, 1020 * MiB, 1000 * MiB) for s in range(15)]
    rows.append(memory_row("fp16", 3, 1100 * MiB, 1000 * MiB, loss_scale=0))  # +10%: worst
    checks = judged(memory_checks(rows, "cuda", min_candidates=16))
    assert checks["at least 16 design candidates measured"]
    assert checks["median |error| vs allocated <= 3%"]
    assert checks["worst |error| vs allocated <= 8%"] is False
    assert checks["error vs reserved (reported beside allocated)"] is None
    assert checks["no candidate starts with memory an earlier one left allocated"]
    rows[3]["leaked_bytes"] = 128 * MiB
    on_cpu = judged(memory_checks(rows, "cpu", min_candidates=16))
    assert on_cpu["worst |error| vs allocated <= 8%"] is None
    assert on_cpu["no candidate starts with memory an earlier one left allocated"] is None
    on_cuda = judged(memory_checks(rows, "cuda", min_candidates=16))
    assert on_cuda["no candidate starts with memory an earlier one left allocated"] is False


def test_precision_and_offload_checks_read_the_memory_probes() -> None:
    rows = [
        memory_row("fp16", 0, 1, 1, loss_scale=0, skipped_steps=3),
        memory_row("bf16", 1, 1, 1),
        memory_row("bf16", 2, 1, 1, offload_optimizer="cpu", pin_memory=True),
    ]
    checks = judged(precision_offload_checks(rows, "cuda", "no libaio"))
    assert checks["fp16 (dynamic loss scale) runs"]
    assert checks["bf16 runs"] and checks["optimizer offload to CPU (pinned) runs"]
    assert checks["NVMe offload runs"] is None
    rows[0]["loss_scale"] = 1024  # a static scale is not what the check asks for
    assert not judged(precision_offload_checks(rows, "cuda", ""))["fp16 (dynamic loss scale) runs"]


def test_study_checks_need_the_confirmation_round_on_a_gpu() -> None:
    status = {
        "trials": [trial(n, candidate("bf16", 0, 1), "ok") for n in range(4)],
        "confirmation": {
            "contenders": [
                {"trial": 0, "label": "a", "samples_per_s": [10.0, 11.0], "estimate": 10.5},
                {"trial": 1, "label": "b", "samples_per_s": [9.0, 9.5], "estimate": 9.2},
            ]
        },
        "best": {"trial": 0, "label": "a", "samples_per_s": 10.5},
    }
    assert all(study_checks(status, 0, True, min_probes=3, confirm=True)[i]["ok"] for i in range(4))
    status["confirmation"] = None
    checks = judged(study_checks(status, 0, True, min_probes=3, confirm=True))
    assert checks["confirmation round interleaved the top candidates"] is False
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
    checks = gpu_tests_checks(outcomes, exit_code=1)
    assert checks[0]["ok"] is False and name in checks[0]["detail"]
    assert checks[1]["ok"] is None and "[16]" in checks[1]["detail"]


def test_the_training_line_is_read_and_judged() -> None:
    checks, data = train_checks("TRAINED global_steps=20 loss=7.1234 samples_per_s=55.5\n", 0, 20)
    assert all(c["ok"] for c in checks) and data["samples_per_s"] == 55.5
    checks, _ = train_checks("TRAINED global_steps=20 loss=nan samples_per_s=1\n", 0, 20)
    assert checks[1]["ok"] is False


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
