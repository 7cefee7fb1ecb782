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
    script_budget_s: float  # each script study's budget (examples/, autotune run --script)
    script_overhead_s: float  # its start, plan, last probe, export, status beyond the budget
    script_max_trials: int  # each script study stops after this many probes
    script_min_probes: int  # ... and must have measured at least this many
    timeouts: dict[str, float]  # each phase's limit: the time plan; 0 = not in the plan
    total_s: float
    # held back from the phases for the moments between them (nvidia-smi after each, the
    # grace a phase's last processes get to end, _driver.LEFTOVER_GRACE_S)
    between_phases_s: float


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
    oom_budget_s=25,
    study_budget_max_s=180,
    study_budget_min_s=45,
    study_overhead_s=40,
    min_probes=3,
    study_max_trials=None,
    study_confirms=True,
    train_steps=20,
    # a cold probe of each script (its own torchrun, imports, engine) and a second where
    # the budget leaves time for it
    script_budget_s=30,
    script_overhead_s=15,
    script_max_trials=2,
    script_min_probes=1,
    # the time plan, in the order the phases run; its sum is the budget. The DiT study
    # does not fit 9 minutes beside the rest: it is reported not verified
    timeouts={
        "install": 40,
        "env": 15,
        "ops": 70,
        "memory": 70,
        "precision_offload": 5,
        "gpu_tests": 50,
        "oom": 65,  # oom_budget_s + OOM_AFTER_S
        "study": 85,  # study_budget_min_s + study_overhead_s
        "train_export": 40,
        "script_deepspeed": 45,  # script_budget_s + script_overhead_s
        "script_trainer": 45,
        "study_dit": 0,
        "world_size": 0,  # needs 2+ GPUs and --world-size-s (beyond one GPU)
    },
    total_s=GPU_BUDGET_S,
    between_phases_s=10,
)
# CPU ranks share two slow cores here with other work: limits are bounds, not targets
DRY_RUN_SETTINGS = Settings(
    dry_run=True,
    workload="gpt-tiny",
    global_batch=16,
    memory_micro_batches=(2, 4),
    memory_precisions=("bf16", "fp32"),  # DeepSpeed's CPU accelerator refuses fp16 here
    oom_precision="fp32",
    oom_budget_s=120,
    # room for a first probe beside other busy test files, which takes 20 s or more there
    # (the launcher's imports, the ranks, DeepSpeed's set-up)
    study_budget_max_s=45,
    study_budget_min_s=45,
    study_overhead_s=285,
    min_probes=1,
    # what a dry run checks (a probe measured, an export that trains) needs no more: each
    # probe and step beyond costs CPU time the rest of the test suite shares (the
    # confirmation round has tests of its own)
    study_max_trials=2,
    study_confirms=False,
    train_steps=8,
    # one probe per script: what the phase judges (a probe measured, activation bytes
    # learned, an export) needs no more on two cores
    script_budget_s=60,
    script_overhead_s=90,
    script_max_trials=1,
    script_min_probes=1,
    # inside the dry-run test's own 1960 s limit
    timeouts={
        "install": 180,
        "env": 60,
        "ops": 180,
        "memory": 330,
        "precision_offload": 5,
        "gpu_tests": 30,
        "oom": 160,  # oom_budget_s + OOM_AFTER_S (with --cpu-oom)
        "study": 330,  # study_budget_min_s + study_overhead_s
        "train_export": 180,
        "script_deepspeed": 150,  # script_budget_s + script_overhead_s
        "script_trainer": 150,
        "study_dit": 0,
        "world_size": 160,  # the study's prediction of 2 CPU ranks against probes at 2
    },
    total_s=1940,
    between_phases_s=25,
)


def phase_needs(settings: Settings) -> dict[str, float]:
    """What each phase needs at least, by its own constants (a phase planned at 0 needs 0:
    it is reported not verified)."""
    study = settings.study_budget_min_s + settings.study_overhead_s
    script = settings.script_budget_s + settings.script_overhead_s
    needs = {name: float(MIN_PHASE_S) for name in settings.timeouts}
    needs.update(oom=settings.oom_budget_s + OOM_AFTER_S, study=study, study_dit=study)
    needs.update(script_deepspeed=script, script_trainer=script)
    return {name: needs[name] if settings.timeouts[name] else 0.0 for name in needs}


def plan_problems(settings: Settings) -> list[str]:
    """Where the time plan does not add up: its sum with the time between phases past the
    budget, a phase under its need."""
    problems = []
    planned = sum(settings.timeouts.values()) + settings.between_phases_s
    if planned > settings.total_s:
        problems.append(
            f"the limits and {settings.between_phases_s:.0f} s between phases add up to "
            f"{planned:.0f} s, past {settings.total_s:.0f} s"
        )
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
    lines.append(
        f"plan: {planned:.0f} s and {settings.between_phases_s:.0f} s between phases, "
        f"{planned + settings.between_phases_s:.0f} s of the {settings.total_s:.0f} s budget"
    )
    return lines + [f"plan does not add up: {p}" for p in plan_problems(settings)]
