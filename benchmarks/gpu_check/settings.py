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
    oom_budget_s: float  # the out-of-memory study's budget, at most
    study_budget_max_s: float
    study_budget_min_s: float
    study_overhead_s: float  # start, plan, the last probe, export, report beyond the budget
    reserve_s: float  # kept for the study and the training by the phases before them
    min_probes: int
    study_max_trials: int | None  # the study also stops after this many probes
    study_confirms: bool  # the study ends with its confirmation round
    train_steps: int  # optimizer steps of the exported config's training
    timeouts: dict[str, float]
    total_s: float


GPU_SETTINGS = Settings(
    dry_run=False,
    workload="gpt2",
    global_batch=32,
    memory_micro_batches=(4, 16),
    memory_precisions=("bf16", "fp16"),
    oom_precision="bf16",
    oom_budget_s=75,
    study_budget_max_s=180,
    study_budget_min_s=60,
    study_overhead_s=50,
    reserve_s=180,  # the study's least budget and overhead, the training's limit, 10 s
    min_probes=3,
    study_max_trials=None,
    study_confirms=True,
    train_steps=20,
    timeouts={
        "install": 90,
        "env": 45,
        "ops": 180,
        "memory": 150,
        "precision_offload": 5,
        "oom": 120,
        "gpu_tests": 200,
        "train_export": 60,
    },
    total_s=480,
)
# CPU ranks share two slow cores here with other work: limits are bounds, not targets
DRY_RUN_SETTINGS = Settings(
    dry_run=True,
    workload="gpt-tiny",
    global_batch=16,
    memory_micro_batches=(2, 4),
    memory_precisions=("bf16", "fp32"),  # DeepSpeed's CPU accelerator refuses fp16 here
    oom_precision="fp32",
    oom_budget_s=240,
    # room for a first probe beside other busy test files, which takes 20 s or more there
    # (the launcher's imports, the ranks, DeepSpeed's set-up)
    study_budget_max_s=45,
    study_budget_min_s=45,
    study_overhead_s=300,
    reserve_s=0,
    min_probes=1,
    # what a dry run checks (a probe measured, an export that trains) needs no more: each
    # probe and step beyond costs CPU time the rest of the test suite shares (the
    # confirmation round has tests of its own)
    study_max_trials=2,
    study_confirms=False,
    train_steps=8,
    timeouts={
        "install": 300,
        "env": 120,
        "ops": 300,
        "memory": 400,
        "precision_offload": 5,
        "oom": 400,
        "gpu_tests": 120,
        "train_export": 300,
    },
    total_s=1800,
)
