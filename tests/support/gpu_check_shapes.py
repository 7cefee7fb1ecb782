"""What the GPU check's judging functions (benchmarks/gpu_check/*_checks.py) read, in the
shapes the phases record, as a run on one CUDA GPU that went right would give them: each
judge's passing input, for the tests that doctor it (tests/benchmarks/) and the tests
that read it as recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.gpu_check import (
    env_checks,
    fsdp2_checks,
    gpu_tests_checks,
    install_checks,
    leftover_check,
    limit_over_predictions,
    memory_checks,
    nvme_checks,
    oom_checks,
    oom_limit,
    ops_checks,
    precision_offload_checks,
    script_checks,
    study_checks,
    train_checks,
    train_speed_check,
    world_size_prediction_check,
)

MiB = 2**20
GiB = 2**30
# GPT-2's allocated peak at the memory design's two micro-batches, roughly
ALLOCATED_BYTES = {4: 5000 * MiB, 16: 20000 * MiB}
FUSED_ADAM = "deepspeed.ops.adam.fused_adam.FusedAdam"
CPU_ADAM = "deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam"
TORCH_ADAMW = "torch.optim.adamw.AdamW"
CUDA_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 384.00 MiB"


# ---------------------------------------------------------------- the memory phase's rows


def memory_row(precision: str, stage: int, mb: int, **extra: Any) -> dict[str, Any]:
    """A measured candidate of the memory design: predicted 2% over its allocated peak,
    stepped with FusedAdam; fp16 with its scale lowered on overflow. Its limit is set by
    :func:`memory_rows`."""
    fp16 = precision == "fp16"
    allocated = ALLOCATED_BYTES[mb]
    return {
        "label": f"z{stage} {precision} mb{mb}",
        "design": True,
        "precision": precision,
        "zero_stage": stage,
        "micro_batch_size": mb,
        "offload_optimizer": "none",
        "offload_param": "none",
        "pin_memory": None,
        "status": "ok",
        "error": "",
        "predicted_bytes": int(1.02 * allocated),
        "allocated_bytes": allocated,
        "reserved_bytes": int(1.05 * allocated),
        "overhead_bytes": 600 * MiB,
        "vram_limit_bytes": 0,
        "leaked_bytes": 0,
        "skipped_steps": 10 if fp16 else 0,
        "loss_scale_at_start": 2.0**24 if fp16 else 0.0,
        "loss_scale_at_end": 2.0**15 if fp16 else 0.0,
        "optimizer": FUSED_ADAM,
        "offloaded_pinned_bytes": 0,
        "offloaded_pageable_bytes": 0,
        "pinned_host_bytes_at_start": 0,
        "pinned_host_bytes_at_end": 0,
        **extra,
    }


def offload_row(optimizer: str, param: str, stage: int) -> dict[str, Any]:
    """An offload extra: DeepSpeed's CPU Adam steps pinned fp32 partitions on the host."""
    return memory_row(
        "bf16",
        stage,
        4,
        label=f"z{stage} bf16 opt:{optimizer} param:{param}",
        design=False,
        offload_optimizer=optimizer,
        offload_param=param,
        pin_memory=True,
        optimizer=CPU_ADAM,
        offloaded_pinned_bytes=500 * MiB,
        offloaded_pageable_bytes=1000 * MiB,
        pinned_host_bytes_at_end=600 * MiB,
    )


def limited(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` under the limit the phase sets: 1.3x the largest prediction."""
    limit = limit_over_predictions([r["predicted_bytes"] for r in rows])
    return [dict(r, vram_limit_bytes=limit) for r in rows]


def memory_rows() -> list[dict[str, Any]]:
    """The 16 design candidates, then the CPU offload extras at ZeRO-2 and 3."""
    design = [
        memory_row(precision, stage, mb)
        for precision in ("bf16", "fp16")
        for stage in (0, 1, 2, 3)
        for mb in (4, 16)
    ]
    return limited([*design, offload_row("cpu", "none", 2), offload_row("cpu", "cpu", 3)])


def nvme_rows() -> list[dict[str, Any]]:
    """The NVMe phase's candidate: ZeRO-3 with optimizer and parameters swapped to disk."""
    return limited([offload_row("nvme", "nvme", 3)])


# ---------------------------------------------------------------- the fsdp2 phase


def fsdp2_row(offload: bool, each: bool, ranks: int = 1) -> dict[str, Any]:
    """A measured FSDP2 candidate: per block (GPT-2's 12 and the root), clipping on,
    predicted 4% over its allocated peak, each rank's engine as asked."""
    allocated = (3000 if offload else 4500) * MiB
    state = {
        "units": 13,
        "resharded_units": 12,
        "post_forward_ranks": ranks,
        "param_dtype": "bfloat16",
        "reduce_dtype": "float32",
        "offload": "CPUOffloadPolicy" if offload else "OffloadPolicy",
        "shard_device": "cpu" if offload else "cuda",
        "checkpointed": False,
        "first_micro_batch_reduced": each,
    }
    label = "fsdp2 bf16 mb4x2 reshard:yes" + " sync:each" * each + " cpu" * offload
    return {
        "label": label,
        "precision": "bf16",
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "ranks": ranks,
        "wrap": "block",
        "cpu_offload": offload,
        "sync_each_micro_batch": each,
        "gradient_clipping": 1.0,
        "vram_limit_bytes": 0,
        "predicted_bytes": int(1.04 * allocated),
        "predicted_host_bytes": 0,
        "phase": "backward",
        "status": "ok",
        "error": "",
        "allocated_bytes": allocated,
        "reserved_bytes": int(1.05 * allocated),
        "overhead_bytes": 600 * MiB,
        "host_peak_bytes": 0,
        "expected_units": 13,
        "sharding": [dict(state) for _ in range(ranks)],
    }


def fsdp2_rows() -> list[dict[str, Any]]:
    """FSDP2's four candidates: CPU offload off and on, reduced at the last micro-batch or
    after each."""
    settings = [(offload, each) for offload in (False, True) for each in (False, True)]
    return limited([fsdp2_row(offload, each) for offload, each in settings])


# ---------------------------------------------------------------- the oom phase


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


def clean_reports() -> dict[int, dict[str, Any]]:
    """The rank reports of the probes that fit: nothing left, the same overhead, within
    the limit."""
    report = {
        "leaked_bytes": 0,
        "device_overhead_bytes": 600 * MiB,
        "peak_reserved_bytes": 2000 * MiB,
    }
    failed = {"leaked_bytes": 0, "device_overhead_bytes": 0, "peak_reserved_bytes": 0}
    return {0: dict(failed), 2: dict(failed), 3: dict(report), 4: dict(report)}


OOM_OVERHEAD_BYTES = 512 * MiB


def oom_limit_bytes() -> int:
    return int(oom_limit(oom_plan(), overhead_bytes=OOM_OVERHEAD_BYTES)["limit_bytes"])


# ---------------------------------------------------------------- studies


def study_status(trials: int = 4) -> dict[str, Any]:
    return {
        "trials": [trial(n, candidate("bf16", 0, 1), "ok") for n in range(trials)],
        "confirmation": {
            "contenders": [
                {"trial": 0, "label": "a", "samples_per_s": [10.0, 11.0], "estimate": 10.5},
                {"trial": 1, "label": "b", "samples_per_s": [9.0, 9.5], "estimate": 9.2},
            ]
        },
        "best": {"trial": 0, "label": "a", "samples_per_s": 10.5},
    }


def script_reports() -> dict[int, dict[str, Any]]:
    return {0: {"activation_bytes": 5 * MiB}, 1: {"activation_bytes": 9 * MiB}}


TRAINED = "TRAINED global_steps=20 loss=7.1234 samples_per_s=55.5\n"
GPU_TESTS = {
    "tests/integration/test_gpu_paths.py::test_zero3_builds_under_zero_init_on_the_device": (
        "PASSED"
    ),
    "tests/integration/test_gpu_paths.py::test_probes_follow_the_float32_matmul_precision": (
        "XPASS"  # its assertions held: a pass
    ),
}


# ---------------------------------------------------------------- every judge, passing


def passing_inputs() -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    """Each judging function with what a run that went right on one CUDA GPU gives it
    (fresh data at each call: a doctored case alters its own copy)."""
    return {
        "install_checks": (
            install_checks,
            {"wheels": 21, "wheels_exit_code": 0, "import_exit_code": 0, "output": ""},
        ),
        "env_checks": (env_checks, {"context_mib": 0.0}),
        "ops_checks": (
            ops_checks,
            {
                "autotune_ops_exit_code": 0,
                "autotune_ops_output": "DeepSpeed ops ready",
                "build_exit_codes": {"FusedAdamBuilder": 0, "CPUAdamBuilder": 0},
            },
        ),
        "leftover_check": (leftover_check, {"leftovers": []}),
        "world_size_prediction_check": (
            world_size_prediction_check,
            {"rows": [{"label": "z0 fp32 mb8x1", "predicted": 180.0, "measured": 190.0}]},
        ),
        "memory_checks": (
            memory_checks,
            {"rows": memory_rows(), "accelerator": "cuda", "min_candidates": 16},
        ),
        "precision_offload_checks": (
            precision_offload_checks,
            {"rows": memory_rows(), "accelerator": "cuda", "fused_adam_builds": True},
        ),
        "nvme_checks": (
            nvme_checks,
            {
                "rows": nvme_rows(),
                "nvme_expected": True,
                "nvme_reason": "",
                "fused_adam_builds": True,
            },
        ),
        "fsdp2_checks": (fsdp2_checks, {"rows": fsdp2_rows(), "accelerator": "cuda"}),
        "oom_checks": (
            oom_checks,
            {
                "status": oom_study(),
                "plan": oom_plan(),
                "reports": clean_reports(),
                "accelerator": "cuda",
                "exit_code": 0,
                "leftovers": [],
                "limit_bytes": oom_limit_bytes(),
                "baseline_overhead_bytes": 600 * MiB,
            },
        ),
        "study_checks": (
            study_checks,
            {
                "status": study_status(),
                "exit_code": 0,
                "exported": True,
                "min_probes": 3,
                "confirm": True,
            },
        ),
        "script_checks": (
            script_checks,
            {
                "status": study_status(trials=2),
                "reports": script_reports(),
                "exit_code": 0,
                "exported": True,
                "min_probes": 1,
            },
        ),
        "train_checks": (
            lambda **kwargs: train_checks(**kwargs)[0],
            {"output": TRAINED, "exit_code": 0, "steps": 20},
        ),
        "train_speed_check": (train_speed_check, {"trained": 55.5, "study": 56.0}),
        "gpu_tests_checks": (gpu_tests_checks, {"outcomes": dict(GPU_TESTS), "exit_code": 0}),
    }


def judged(checks: list[dict[str, Any]] | dict[str, Any]) -> dict[str, bool | None]:
    """Each check's name and outcome (a judge that makes one check gives a dict)."""
    listed = [checks] if isinstance(checks, dict) else checks
    return {c["name"]: c["ok"] for c in listed}
