"""The GPU check's settings: what each mode (GPU or CPU dry run) checks with, and its limits.

Standard library only, as the whole check's driver (benchmarks/gpu_check/_driver.py).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Settings:
    """What a mode (GPU or CPU dry run) checks with."""

    dry_run: bool
    workload: str
    global_batch: int
    memory_micro_batches: tuple[int, int]
    memory_precisions: tuple[str, str]
    oom_precision: str
    oom_budget_s: float  # the out-of-memory study's budget, at most (plus OOM_AFTER_S)
    study_budget_max_s: float
    study_budget_min_s: float
    study_overhead_s: float  # start, plan, the last probe, export, report beyond the budget
    min_probes: int
    study_max_trials: int | None  # the study also stops after this many probes
    study_confirms: bool  # the study ends with its confirmation round
    train_steps: int  # optimizer steps of the exported config's training
    timeouts: dict[str, float]  # each phase's limit: the time plan; 0 = not in the plan
    total_s: float


# the GPU check's whole budget: at most 9 minutes of the 15 minutes of device time a session
# is lent, so that the machine's start and a rerun of what failed (--skip the rest) fit after
GPU_BUDGET_S = 540
# a phase given less than this is skipped (the driver's floor: no command starts in less)
MIN_PHASE_S = 5
# what the oom phase needs beyond its study's budget: the plan, `autotune status`, start-up
OOM_AFTER_S = 40


GPU_SETTINGS = Settings(
    dry_run=False,
    workload="gpt2",
    global_batch=32,
    memory_micro_batches=(4, 16),
    memory_precisions=("bf16", "fp16"),
    oom_precision="bf16",
    oom_budget_s=40,
    study_budget_max_s=180,
    study_budget_min_s=60,
    study_overhead_s=50,
    min_probes=3,
    study_max_trials=None,
    study_confirms=True,
    train_steps=20,
    # the time plan, in the order the phases run; its sum is the budget. The DiT study
    # does not fit 9 minutes beside the rest: it is reported not verified
    timeouts={
        "install": 45,
        "env": 20,
        "ops": 90,
        "memory": 75,
        "precision_offload": 5,
        "gpu_tests": 55,
        "oom": 80,  # oom_budget_s + OOM_AFTER_S
        "study": 110,  # study_budget_min_s + study_overhead_s
        "train_export": 60,
        "study_dit": 0,
    },
    total_s=GPU_BUDGET_S,
)
# CPU ranks share two slow cores here with other work: limits are bounds, not targets
DRY_RUN_SETTINGS = Settings(
    dry_run=True,
    workload="gpt-tiny",
    global_batch=16,
    memory_micro_batches=(2, 4),
    memory_precisions=("bf16", "fp32"),  # DeepSpeed's CPU accelerator refuses fp16 here
    oom_precision="fp32",
    oom_budget_s=200,
    # room for a first probe beside other busy test files, which takes 20 s or more there
    # (the launcher's imports, the ranks, DeepSpeed's set-up)
    study_budget_max_s=45,
    study_budget_min_s=45,
    study_overhead_s=300,
    min_probes=1,
    # what a dry run checks (a probe measured, an export that trains) needs no more: each
    # probe and step beyond costs CPU time the rest of the test suite shares (the
    # confirmation round has tests of its own)
    study_max_trials=2,
    study_confirms=False,
    train_steps=8,
    # inside the dry-run test's own 1800 s limit
    timeouts={
        "install": 220,
        "env": 90,
        "ops": 240,
        "memory": 360,
        "precision_offload": 5,
        "gpu_tests": 60,
        "oom": 240,  # oom_budget_s + OOM_AFTER_S (with --cpu-oom)
        "study": 345,  # study_budget_min_s + study_overhead_s
        "train_export": 220,
        "study_dit": 0,
    },
    total_s=1780,
)


def phase_needs(settings: Settings) -> dict[str, float]:
    """What each phase needs at least, by its own constants (a phase planned at 0 needs 0:
    it is reported not verified)."""
    study = settings.study_budget_min_s + settings.study_overhead_s
    needs = {name: float(MIN_PHASE_S) for name in settings.timeouts}
    needs.update(oom=settings.oom_budget_s + OOM_AFTER_S, study=study, study_dit=study)
    return {name: needs[name] if settings.timeouts[name] else 0.0 for name in needs}


def plan_problems(settings: Settings) -> list[str]:
    """Where the time plan does not add up: its sum past the budget, a phase under its need."""
    problems = []
    planned = sum(settings.timeouts.values())
    if planned > settings.total_s:
        problems.append(f"the limits add up to {planned:.0f} s, past {settings.total_s:.0f} s")
    for name, need in phase_needs(settings).items():
        if settings.timeouts[name] < need:
            problems.append(f"{name}: {settings.timeouts[name]:.0f} s, under its {need:.0f} s")
    return problems


def plan_lines(settings: Settings) -> list[str]:
    """The time plan as printed at the start: each phase's limit, their sum, the budget."""
    lines = [
        f"plan: {name} {limit:.0f} s" + ("" if limit else " (not in the plan: not verified)")
        for name, limit in settings.timeouts.items()
    ]
    planned = sum(settings.timeouts.values())
    lines.append(f"plan: {planned:.0f} s of the {settings.total_s:.0f} s budget")
    return lines + [f"plan does not add up: {p}" for p in plan_problems(settings)]
