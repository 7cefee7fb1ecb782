"""The GPU check's settings: what each mode (GPU or CPU dry run) checks with, and its time
plan: each phase's limit, re-planned from an earlier report's wall times with
``--plan-from`` (:func:`replan`).

Standard library only, as the whole check's driver (benchmarks/gpu_check/_driver.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass
class Settings:
    """What a mode (GPU or CPU dry run) checks with."""

    dry_run: bool
    workload: str
    global_batch: int
    # ranks of the memory, NVMe and FSDP2 phases' probes: one GPU, or two CPU ranks (where
    # the memory model's CPU terms were measured, benchmarks/RESULTS.md)
    probe_ranks: int
    memory_micro_batches: tuple[int, int]
    memory_precisions: tuple[str, str]
    fsdp2_micro_batch: int  # FSDP2's candidates accumulate 2 of these per step
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
    # phases planned at 0 that run, after the plan, in the time it leaves (at least their
    # need): on a GPU the script studies, which come last in what the check proves
    if_time_left: tuple[str, ...] = ()


# the GPU check's whole budget, install included: at most 9 minutes of the 15 minutes of
# device time a session is lent, so that the machine's start and its install fit beside it
GPU_BUDGET_S = 540
# a phase given less than this is skipped (the driver's floor: no command starts in less)
MIN_PHASE_S = 5
# what the oom phase needs beyond its study's budget: the plan, `autotune status`, start-up
OOM_AFTER_S = 40
# phases outside the budget, each added to it when a flag gives it time: the world-size
# comparison (2+ devices, --world-size-s) and NVMe offload (--nvme)
BEYOND_BUDGET = ("world_size", "nvme")
# what --nvme adds to the budget: NVMe offload in a launch of its own (GPU, dry run)
NVME_S = {False: 60.0, True: 200.0}
# phases whose length is the budget of a study they run, set from their limit: their wall
# time says how long their limit was, not what they need (a re-plan keeps their limit)
BUDGETED = ("oom", "study", "script_deepspeed", "script_trainer", "study_dit", "world_size")
# a re-planned limit: the measured wall time with this share and these seconds on top
PLAN_MARGIN = 0.3
PLAN_PAD_S = 5.0


GPU_SETTINGS = Settings(
    dry_run=False,
    workload="gpt2",
    global_batch=32,
    probe_ranks=1,
    memory_micro_batches=(4, 16),
    memory_precisions=("bf16", "fp16"),
    fsdp2_micro_batch=4,
    oom_precision="bf16",
    oom_budget_s=20,
    study_budget_max_s=180,
    study_budget_min_s=40,
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
    # the time plan, in the order the phases run (what they prove: CUDA's memory truths,
    # FSDP2, precision and offload, the study and its export, then the scripts); its sum
    # with the time between phases is within the budget. Each limit is an estimate for
    # GPT-2 124M on an H100 until a run's report re-plans it (--plan-from). The scripts run
    # in what the plan leaves; the DiT study does not fit 9 minutes beside the rest
    timeouts={
        "install": 35,
        "env": 15,
        "ops": 70,  # FusedAdam, CPU Adam and async I/O built side by side
        "memory": 95,  # the predictions, then 18 candidates in one warm launch
        "gpu_tests": 75,  # the warm fixture: four launches (TF32 apart), nine candidates
        "oom": 60,  # oom_budget_s + OOM_AFTER_S
        "fsdp2": 65,  # four candidates in one launch, the export's launch.sh two steps
        "precision_offload": 5,  # read from the memory phase's probes
        "study": 80,  # study_budget_min_s + study_overhead_s
        "train_export": 30,
        "script_deepspeed": 0,  # in the time left (if_time_left)
        "script_trainer": 0,
        "study_dit": 0,
        "world_size": 0,  # needs 2+ GPUs and --world-size-s (beyond the budget)
        "nvme": 0,  # --nvme (beyond the budget)
    },
    total_s=GPU_BUDGET_S,
    between_phases_s=10,
    if_time_left=("script_deepspeed", "script_trainer"),
)
# CPU ranks share two slow cores here with other work: limits are bounds, not targets
DRY_RUN_SETTINGS = Settings(
    dry_run=True,
    workload="gpt-tiny",
    global_batch=16,
    probe_ranks=2,
    memory_micro_batches=(2, 4),
    memory_precisions=("bf16", "fp32"),  # DeepSpeed's CPU accelerator refuses fp16 here
    fsdp2_micro_batch=2,
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
    # inside the dry-run test's own limit, NVMe (--nvme) included
    timeouts={
        "install": 180,
        "env": 60,
        "ops": 180,
        "memory": 400,
        "gpu_tests": 60,
        "oom": 160,  # oom_budget_s + OOM_AFTER_S (with --cpu-oom)
        "fsdp2": 300,
        "precision_offload": 5,
        "study": 330,  # study_budget_min_s + study_overhead_s
        "train_export": 180,
        "script_deepspeed": 150,  # script_budget_s + script_overhead_s
        "script_trainer": 150,
        "study_dit": 0,
        "world_size": 160,  # the study's prediction of 2 CPU ranks against probes at 2
        "nvme": 0,  # --nvme
    },
    total_s=2340,
    between_phases_s=25,
)


def phase_needs(settings: Settings) -> dict[str, float]:
    """What each phase needs at least, by its own constants (a phase planned at 0 needs 0:
    it is reported not verified, or runs in the time the plan leaves)."""
    return {
        name: own_need(settings, name) if settings.timeouts[name] else 0.0
        for name in settings.timeouts
    }


def own_need(settings: Settings, name: str) -> float:
    """What phase ``name`` needs at least, by its own constants, planned or not."""
    study = settings.study_budget_min_s + settings.study_overhead_s
    script = settings.script_budget_s + settings.script_overhead_s
    needs = {"oom": settings.oom_budget_s + OOM_AFTER_S, "study": study, "study_dit": study}
    needs.update(script_deepspeed=script, script_trainer=script)
    return float(needs.get(name, MIN_PHASE_S))


def planned_s(settings: Settings) -> float:
    """The planned limits' sum with the time between phases."""
    return sum(settings.timeouts.values()) + settings.between_phases_s


def plan_problems(settings: Settings) -> list[str]:
    """Where the time plan does not add up: its sum with the time between phases past the
    budget, a phase under its need."""
    problems = []
    planned = planned_s(settings)
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
    lines = []
    for name, limit in settings.timeouts.items():
        if limit:
            lines.append(f"plan: {name} {limit:.0f} s")
        elif name in settings.if_time_left:
            need = own_need(settings, name)
            lines.append(f"plan: {name} in the time the plan leaves (at least {need:.0f} s)")
        else:
            lines.append(f"plan: {name} 0 s (not in the plan: not verified)")
    planned = sum(settings.timeouts.values())
    lines.append(
        f"plan: {planned:.0f} s and {settings.between_phases_s:.0f} s between phases, "
        f"{planned + settings.between_phases_s:.0f} s of the {settings.total_s:.0f} s budget"
    )
    return lines + [f"plan does not add up: {p}" for p in plan_problems(settings)]


def replan(
    settings: Settings, phases: list[dict[str, Any]], budget_s: float | None = None
) -> Settings:
    """The time plan re-made from an earlier report's phases (``gpu_check.json``'s
    ``phases``, each with its wall time ``seconds``): a phase that ran through
    (:func:`ran_through`) gets its wall time with :data:`PLAN_MARGIN` and
    :data:`PLAN_PAD_S` on top, at least its need (a planned study's phase keeps its limit,
    since its study filled it, unless it ran out of it; one that ran in the time left is
    planned now); one that did not run keeps its limit. Where the plan then exceeds
    ``budget_s`` (the settings' budget by default), the last phases in the order of what
    they prove leave it (0: not verified, or back to the time left); the phases beyond the
    budget (:data:`BEYOND_BUDGET`) keep theirs."""
    beyond = sum(settings.timeouts[name] for name in BEYOND_BUDGET)
    budget = settings.total_s - beyond
    budget = min(budget, budget_s) if budget_s else budget
    ran = {p["name"]: p for p in phases if ran_through(p)}
    timeouts = dict(settings.timeouts)
    for name in timeouts:
        if name in BEYOND_BUDGET or name not in ran:
            continue
        measured = math.ceil(float(ran[name]["seconds"]) * (1 + PLAN_MARGIN) + PLAN_PAD_S)
        keep = name in BUDGETED and ran[name]["status"] != "timeout" and timeouts[name]
        timeouts[name] = max(own_need(settings, name), timeouts[name] if keep else measured)
    for name in reversed(list(timeouts)):
        if sum(timeouts.values()) - beyond + settings.between_phases_s <= budget:
            break
        if name not in BEYOND_BUDGET:
            timeouts[name] = 0.0
    # a phase planned now runs under its limit; one left out that may run in the time left
    # still does
    left = tuple(name for name in settings.if_time_left if not timeouts[name])
    return dataclasses.replace(
        settings, timeouts=timeouts, total_s=budget + beyond, if_time_left=left
    )


def ran_through(phase: dict[str, Any]) -> bool:
    """Whether a reported phase's wall time says what it needs: it ran to its end (passed,
    or failed by its checks) or out of its limit; a phase skipped or broken by an error
    says nothing of it."""
    if phase.get("status") in ("passed", "timeout"):
        return True
    failed_checks = any(c.get("ok") is False for c in phase.get("checks", []))
    return phase.get("status") == "failed" and failed_checks
