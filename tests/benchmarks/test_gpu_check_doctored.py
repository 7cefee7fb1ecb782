"""Every check of the GPU check can fail: each judging function (the public ``*_check`` and
``*_checks`` functions of benchmarks/gpu_check/*_checks.py, the only places a check is
made) passes on what a run that went right on one GPU gives it, and each check it makes
turns red (failed) on that input doctored to be wrong. A new check without a doctored case
here fails :func:`test_every_check_has_a_doctored_case`. And a phase skipped, out of time
or missing leaves the verdict not verified, never passed."""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu_check._phases import PHASES
from benchmarks.gpu_check.report import verdict
from tests.support.gpu_check_shapes import (
    FUSED_ADAM,
    TORCH_ADAMW,
    GiB,
    MiB,
    judged,
    limited,
    passing_inputs,
)
from tests.support.paths import ROOT

PACKAGE = ROOT / "benchmarks" / "gpu_check"
JUDGING_MODULES = sorted(p.stem for p in PACKAGE.glob("*_checks.py"))
Doctor = Callable[[dict[str, Any]], None]


def judges() -> dict[str, Callable[..., Any]]:
    """Every public ``*_check``/``*_checks`` function the judging modules define."""
    found = {}
    for name in JUDGING_MODULES:
        module = importlib.import_module(f"benchmarks.gpu_check.{name}")
        for attr, value in vars(module).items():
            if (
                inspect.isfunction(value)
                and value.__module__ == module.__name__
                and not attr.startswith("_")
                and attr.endswith(("_check", "_checks"))
            ):
                found[attr] = value
    return found


def rows_where(kwargs: dict[str, Any], test: Callable[[dict[str, Any]], bool]) -> list[dict]:
    return [r for r in kwargs["rows"] if test(r)]


def set_rows(kwargs: dict[str, Any], test: Callable[[dict[str, Any]], bool], **values: Any):
    for row in rows_where(kwargs, test):
        row.update(values)


def drop_rows(kwargs: dict[str, Any], test: Callable[[dict[str, Any]], bool]) -> None:
    kwargs["rows"] = [r for r in kwargs["rows"] if not test(r)]


def fp16(r: dict[str, Any]) -> bool:
    return r["precision"] == "fp16"


def bf16(r: dict[str, Any]) -> bool:
    return r["precision"] == "bf16"


def cpu_offload(r: dict[str, Any]) -> bool:
    return "cpu" in (r["offload_optimizer"], r["offload_param"])


def nvme(r: dict[str, Any]) -> bool:
    return r["offload_optimizer"] == "nvme"


def on_device(r: dict[str, Any]) -> bool:
    return r["offload_optimizer"] == "none"


def first_design(kwargs: dict[str, Any]) -> dict[str, Any]:
    return kwargs["rows"][0]


def largest(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The row with the largest prediction: the one the limit is set from."""
    return max(kwargs["rows"], key=lambda r: r["predicted_bytes"])


def predict_at(row: dict[str, Any], share: float) -> None:
    """``row``'s prediction at ``share`` of its measured peak."""
    row["predicted_bytes"] = int(share * row["allocated_bytes"])


def fsdp2_setting(row: dict[str, Any]) -> tuple[bool, bool]:
    return row["cpu_offload"], row["sync_each_micro_batch"]


def rows_with(kwargs: dict[str, Any], offload: bool, each: bool) -> dict[str, Any]:
    """The FSDP2 row with this CPU offload and gradient-sync mode."""
    return next(r for r in kwargs["rows"] if fsdp2_setting(r) == (offload, each))


def each_rank(row: dict[str, Any], **values: Any) -> None:
    for state in row["sharding"]:
        state.update(values)


def trials(kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    return kwargs["status"]["trials"]


# ---------------------------------------------------------------- the doctored cases

# (judge, check) -> ways to doctor the passing input so that this check fails
DOCTORED: dict[tuple[str, str], list[Doctor]] = {
    ("install_checks", "the carried wheels install"): [
        lambda k: k.update(wheels_exit_code=1),
        lambda k: k.update(wheels=0),
    ],
    ("install_checks", "autotune and its dependencies import"): [
        lambda k: k.update(import_exit_code=1, output="ModuleNotFoundError: No module 'optuna'"),
    ],
    ("env_checks", "the driver's hardware detection holds no CUDA context"): [
        lambda k: k.update(context_mib=514.0),
    ],
    ("ops_checks", "autotune's op check passes"): [
        lambda k: k.update(autotune_ops_exit_code=1),
    ],
    ("ops_checks", "CPU Adam builds"): [
        lambda k: k["build_exit_codes"].update(CPUAdamBuilder=1),
        lambda k: k["build_exit_codes"].pop("CPUAdamBuilder"),
    ],
    ("leftover_check", "no process left running"): [
        lambda k: k.update(leftovers=["4242 python -m autotune.probe.rank"]),
    ],
    ("memory_checks", "at least 16 design candidates measured"): [
        lambda k: k.update(rows=k["rows"][1:]),
    ],
    ("memory_checks", "every design candidate ran"): [
        lambda k: first_design(k).update(status="oom", error="CUDA out of memory"),
        lambda k: k.update(rows=[r for r in k["rows"] if not r["design"]]),
    ],
    ("memory_checks", "median |error| vs allocated <= 3%"): [
        lambda k: [predict_at(r, 1.05) for r in k["rows"]],
    ],
    ("memory_checks", "worst |error| vs allocated <= 8%"): [
        lambda k: predict_at(first_design(k), 1.10),
        lambda k: predict_at(first_design(k), 0.90),
    ],
    ("memory_checks", "every candidate's peak stays within the limit it ran under"): [
        # the largest candidate's reserved peak and overhead past 1.3x its prediction
        lambda k: largest(k).update(reserved_bytes=int(1.3 * largest(k)["allocated_bytes"])),
        lambda k: first_design(k).update(vram_limit_bytes=None),
    ],
    ("memory_checks", "no candidate starts with memory an earlier one left allocated"): [
        lambda k: first_design(k).update(leaked_bytes=128 * MiB),
    ],
    ("precision_offload_checks", "fp16 runs"): [
        lambda k: rows_where(k, fp16)[0].update(status="error", error="overflow"),
        lambda k: drop_rows(k, fp16),  # on CUDA the design has fp16 candidates
    ],
    (
        "precision_offload_checks",
        "fp16's loss scale is dynamic: the engine lowered it on overflow",
    ): [
        lambda k: set_rows(k, fp16, loss_scale_at_end=2.0**24),  # skipped steps, scale kept
        lambda k: set_rows(k, fp16, loss_scale_at_start=0.0, loss_scale_at_end=0.0),
    ],
    ("precision_offload_checks", "bf16 runs"): [
        lambda k: rows_where(k, bf16)[0].update(status="timeout"),
        lambda k: drop_rows(k, bf16),
    ],
    ("precision_offload_checks", "optimizer offload to CPU runs"): [
        lambda k: rows_where(k, cpu_offload)[1].update(status="error", error="cudaHostAlloc"),
        lambda k: drop_rows(k, cpu_offload),
    ],
    ("precision_offload_checks", "offloaded optimizer memory is page-locked (pinned)"): [
        lambda k: set_rows(k, cpu_offload, offloaded_pinned_bytes=0, pinned_host_bytes_at_end=0),
        lambda k: set_rows(k, cpu_offload, pin_memory=False),
        lambda k: set_rows(
            k,
            cpu_offload,
            offloaded_pinned_bytes=0,
            offloaded_pageable_bytes=0,
            pinned_host_bytes_at_end=0,
        ),
    ],
    (
        "precision_offload_checks",
        "the probes stepped with the optimizer the ops allow (FusedAdam, else torch's Adam)",
    ): [
        lambda k: rows_where(k, on_device)[0].update(optimizer=TORCH_ADAMW),
        lambda k: rows_where(k, on_device)[0].update(optimizer=""),
        lambda k: rows_where(k, cpu_offload)[0].update(optimizer=FUSED_ADAM),
        # FusedAdam does not build: the probes must step with torch's Adam ...
        lambda k: k.update(fused_adam_builds=False),
        # ... and run
        lambda k: (
            k.update(fused_adam_builds=False),
            set_rows(k, on_device, optimizer=TORCH_ADAMW),
            rows_where(k, on_device)[0].update(status="error", error="RuntimeError"),
        ),
    ],
    ("nvme_checks", "NVMe offload runs"): [
        lambda k: rows_where(k, nvme)[0].update(status="timeout", error="ran past 300 s"),
        lambda k: drop_rows(k, nvme),  # async I/O built and the disk had room
    ],
    (
        "nvme_checks",
        "the probes stepped with the optimizer the ops allow (FusedAdam, else torch's Adam)",
    ): [
        lambda k: rows_where(k, nvme)[0].update(optimizer=FUSED_ADAM),
        lambda k: drop_rows(k, nvme),
    ],
    (
        "fsdp2_checks",
        "every FSDP2 candidate ran: per block, CPU offload off and on, reduced after every "
        "micro-batch and only at the last, clipping on",
    ): [
        lambda k: rows_with(k, True, False).update(status="error", error="no backend for cpu"),
        lambda k: rows_with(k, False, True).update(wrap="model"),
        lambda k: rows_with(k, True, True).update(gradient_clipping=0.0),
        lambda k: k["rows"].remove(rows_with(k, True, True)),  # a setting never probed
    ],
    (
        "fsdp2_checks",
        "fully_shard sharded every block and the root with the offload asked (each rank)",
    ): [
        lambda k: each_rank(rows_with(k, False, False), units=1),  # the root alone
        lambda k: each_rank(rows_with(k, True, False), offload="OffloadPolicy"),
        lambda k: each_rank(rows_with(k, True, True), shard_device="cuda"),
        lambda k: each_rank(rows_with(k, False, True), shard_device="cpu"),
        lambda k: rows_with(k, False, False).update(sharding=[]),  # no rank report
    ],
    (
        "fsdp2_checks",
        "gradients reduced as asked: after every micro-batch, or only at the last "
        "(the first micro-batch's gradients, each rank)",
    ): [
        lambda k: each_rank(rows_with(k, False, False), first_micro_batch_reduced=True),
        lambda k: each_rank(rows_with(k, True, True), first_micro_batch_reduced=False),
        lambda k: each_rank(rows_with(k, True, True), first_micro_batch_reduced=None),
    ],
    ("fsdp2_checks", "FSDP2's peak within 15% of the memory model (worst |error|)"): [
        lambda k: predict_at(rows_with(k, True, False), 1.3),
        lambda k: predict_at(rows_with(k, False, True), 0.8),
    ],
    ("fsdp2_checks", "no FSDP2 peak above its prediction by more than 5%"): [
        lambda k: predict_at(rows_with(k, False, False), 0.9),
    ],
    ("oom_checks", "a probe over the limit is recorded oom with CUDA's message"): [
        lambda k: [t.update(error="rank 0: rank tensor memory over the limit") for t in trials(k)],
        lambda k: [t.update(status="ok") for t in trials(k) if t["status"] == "oom"],
    ],
    ("oom_checks", "the study went on after the out-of-memory and exported a fitting config"): [
        lambda k: k.update(exit_code=3),
        lambda k: [t.update(status="pruned") for t in trials(k) if t["number"] > 0],
    ],
    ("oom_checks", "no larger micro-batch of an out-of-memory family probed after it"): [
        lambda k: trials(k)[1].update(status="ok", pruned_by=""),
    ],
    ("oom_checks", "larger micro-batches ruled out without a probe"): [
        lambda k: k["plan"].update(
            candidates=[
                c for c in k["plan"]["candidates"] if c["candidate"]["micro_batch_size"] == 1
            ]
        ),
    ],
    ("oom_checks", "no memory or process left behind by the out-of-memory probe"): [
        lambda k: k["reports"][3].update(device_overhead_bytes=2600 * MiB),
        lambda k: k["reports"][2].update(leaked_bytes=200 * MiB),
        lambda k: k["reports"].pop(2),
        lambda k: k.update(leftovers=["77 torchrun"]),
    ],
    (
        "oom_checks",
        "the probes that fit stayed within the limit (reserved peak with the overhead)",
    ): [
        lambda k: k["reports"][4].update(peak_reserved_bytes=k["limit_bytes"] + MiB),
        lambda k: k["reports"].pop(4),
    ],
    ("study_checks", "the run exported a config (exit code 0)"): [
        lambda k: k.update(exported=False),
        lambda k: k.update(exit_code=1),
    ],
    ("study_checks", "at least 3 probe(s) measured"): [
        lambda k: k["status"].update(trials=trials(k)[:2]),
    ],
    ("study_checks", "no probe failed (error, timeout)"): [
        lambda k: trials(k)[2].update(status="timeout"),
    ],
    ("study_checks", "confirmation round interleaved the top candidates"): [
        lambda k: k["status"].update(confirmation=None),
    ],
    ("script_checks", "the run exported a config (exit code 0)"): [
        lambda k: k.update(exported=False),
    ],
    ("script_checks", "at least 1 probe(s) measured"): [
        lambda k: [t.update(status="error") for t in trials(k)],
    ],
    ("script_checks", "no probe failed (error, timeout)"): [
        lambda k: trials(k)[1].update(status="error", error="train.py line 70 raised"),
    ],
    ("script_checks", "activation bytes learned from every measured probe (rank report > 0)"): [
        lambda k: k["reports"][1].update(activation_bytes=0),
        lambda k: k["reports"].pop(0),
        lambda k: k.update(reports={}),
    ],
    ("train_checks", "the exported config trains unedited"): [
        lambda k: k.update(exit_code=1),
    ],
    ("train_checks", "20 optimizer steps with a finite loss"): [
        lambda k: k.update(output=k["output"].replace("loss=7.1234", "loss=nan")),
        lambda k: k.update(output=k["output"].replace("global_steps=20", "global_steps=12")),
        lambda k: k.update(output="Traceback (most recent call last):"),
    ],
    ("train_speed_check", "the exported config trains within 15% of the study's speed"): [
        lambda k: k.update(trained=40.0),
        lambda k: k.update(trained=80.0),
    ],
    (
        "world_size_prediction_check",
        "the prediction of 2 devices from probes at 1 is within 25% of the probes at 2 (median)",
    ): [
        lambda k: k["rows"][0].update(predicted=130.0),
        lambda k: k.update(rows=[{**k["rows"][0], "predicted": 50.0}] * 3),
    ],
    ("gpu_tests_checks", "every gpu test in the plan passed (a failure marked xfail is no pass)"): [
        lambda k: k["outcomes"].update({"tests/x.py::test_y": "FAILED"}),
        # a failure marked xfail leaves pytest's exit code 0: still no pass
        lambda k: k["outcomes"].update({"tests/x.py::test_y": "XFAIL"}),
        lambda k: k["outcomes"].update({"tests/x.py::test_y": "SKIPPED"}),
        lambda k: k.update(outcomes={}, exit_code=5),
        lambda k: k.update(exit_code=1),
    ],
}


def passing_checks() -> list[tuple[str, str]]:
    """(judge, check) for every check every judge makes on its passing input."""
    pairs = []
    for judge, (function, kwargs) in passing_inputs().items():
        pairs += [(judge, name) for name in judged(function(**kwargs))]
    return pairs


def test_every_judging_function_has_a_passing_input() -> None:
    assert set(judges()) == set(passing_inputs())


@pytest.mark.parametrize("judge", sorted(passing_inputs()))
def test_a_run_that_went_right_passes_every_check(judge: str) -> None:
    function, kwargs = passing_inputs()[judge]
    outcomes = judged(function(**kwargs))
    assert outcomes and all(ok is True for ok in outcomes.values()), outcomes


def test_every_check_has_a_doctored_case() -> None:
    made = passing_checks()
    assert len(made) == len(set(made)), "two checks of one judge share a name"
    assert set(made) == set(DOCTORED)


@pytest.mark.parametrize(
    ("judge", "name", "case"),
    [(judge, name, i) for (judge, name), cases in DOCTORED.items() for i in range(len(cases))],
)
def test_each_check_turns_red_on_its_doctored_input(judge: str, name: str, case: int) -> None:
    function, kwargs = passing_inputs()[judge]
    doctored = copy.deepcopy(kwargs)
    DOCTORED[(judge, name)][case](doctored)
    assert judged(function(**doctored)).get(name) is False


def test_the_memory_limit_is_tight_enough_for_a_peak_over_it_to_fail() -> None:
    """The limit is 1.3x the largest prediction, not the card less 2 GiB: a candidate whose
    peak lies 30% above its prediction shows over it, where an 80 GB card would hide it."""
    function, kwargs = passing_inputs()["memory_checks"]
    name = "every candidate's peak stays within the limit it ran under"
    biggest = max(kwargs["rows"], key=lambda r: r["predicted_bytes"])
    assert biggest["vram_limit_bytes"] == int(1.3 * biggest["predicted_bytes"])
    biggest["reserved_bytes"] = int(1.3 * biggest["allocated_bytes"])
    assert judged(function(**kwargs))[name] is False
    card = [dict(r, vram_limit_bytes=78 * GiB) for r in kwargs["rows"]]
    assert judged(function(**dict(kwargs, rows=card)))[name] is True
    again = limited([dict(r, vram_limit_bytes=0) for r in kwargs["rows"]])
    assert judged(function(**dict(kwargs, rows=again)))[name] is False


def test_the_fallback_to_torch_adam_passes_when_its_probes_ran() -> None:
    function, kwargs = passing_inputs()["precision_offload_checks"]
    kwargs["fused_adam_builds"] = False
    set_rows(kwargs, on_device, optimizer=TORCH_ADAMW)
    name = "the probes stepped with the optimizer the ops allow (FusedAdam, else torch's Adam)"
    check = next(c for c in function(**kwargs) if c["name"] == name)
    assert check["ok"] is True
    assert "FusedAdam does not build" in check["detail"] and TORCH_ADAMW in check["detail"]


def test_what_a_cpu_dry_run_cannot_judge_is_not_verified_with_its_reason() -> None:
    function, kwargs = passing_inputs()["precision_offload_checks"]
    drop_rows(kwargs, fp16)
    kwargs.update(accelerator="cpu")
    checks = {c["name"]: c for c in function(**kwargs)}
    assert checks["fp16 runs"]["ok"] is None and checks["fp16 runs"]["detail"]
    assert checks["offloaded optimizer memory is page-locked (pinned)"]["ok"] is None
    function, kwargs = passing_inputs()["nvme_checks"]
    kwargs.update(rows=[], nvme_expected=False, nvme_reason="the async I/O op does not build")
    for check in function(**kwargs):
        assert check["ok"] is None and "async I/O" in check["detail"], check


# ---------------------------------------------------------------- checks are made in one place


def made_checks(path: Path) -> list[str]:
    """Where ``path`` makes a check itself: a call of ``check(...)`` or a dict with "ok"."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "check":
            found.append(f"{path.name}:{node.lineno}")
        if isinstance(node, ast.Dict) and any(
            isinstance(k, ast.Constant) and k.value == "ok" for k in node.keys
        ):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_phase_makes_a_check_of_its_own() -> None:
    others = [
        p for p in PACKAGE.glob("*.py") if p.stem not in JUDGING_MODULES and p.name != "report.py"
    ]
    assert others and [line for p in others for line in made_checks(p)] == []


# ---------------------------------------------------------------- skipped and missing phases


def all_passing_phases() -> list[dict[str, Any]]:
    checks = [
        c for function, kwargs in passing_inputs().values() for c in _listed(function(**kwargs))
    ]
    return [
        {"name": name, "status": "passed", "reason": "", "checks": copy.deepcopy(checks)}
        for name, _ in PHASES
    ]


def _listed(checks: list[dict[str, Any]] | dict[str, Any]) -> list[dict[str, Any]]:
    return [checks] if isinstance(checks, dict) else checks


EXPECTED = [name for name, _ in PHASES]


def test_a_run_where_every_phase_passed_is_passed_save_what_one_gpu_cannot_show() -> None:
    assert verdict(all_passing_phases(), EXPECTED, beyond=())["status"] == "passed"
    whole = verdict(all_passing_phases(), EXPECTED)
    assert whole["status"] == "not verified" and whole["failed"] == []
    assert len(whole["not_verified"]) == whole["beyond_one_gpu"] == 3


@pytest.mark.parametrize("phase", EXPECTED)
@pytest.mark.parametrize("how", ["skipped", "timeout", "missing"])
def test_a_phase_skipped_out_of_time_or_missing_is_not_verified(phase: str, how: str) -> None:
    phases = all_passing_phases()
    if how == "missing":
        phases = [p for p in phases if p["name"] != phase]
    else:
        doctored = next(p for p in phases if p["name"] == phase)
        doctored.update(status=how, reason="no time left", checks=[])
    v = verdict(phases, EXPECTED, beyond=())
    assert v["status"] == "not verified" and v["failed"] == []
    assert [i["where"] for i in v["not_verified"]] == [phase]
    assert v["not_verified"][0]["reason"]
