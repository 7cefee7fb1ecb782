"""The GPU check's steps that run inside its environment (they import autotune, torch and
DeepSpeed); the check's phases start each as a subprocess, by this file's path, and read the
JSON it prints or writes.

    python benchmarks/gpu_check/probes.py env
    python benchmarks/gpu_check/probes.py build-op FusedAdamBuilder
    python benchmarks/gpu_check/probes.py memory --out rows.json --root DIR --workload gpt2 ...

``memory`` probes the memory model's design (bf16 and fp16 x ZeRO 0-3 x two micro-batches x
activation checkpointing) and the offload candidates in warm launches of one rank (the
candidates one after another in the same process; a failed candidate ends its launch and
the rest continue in a fresh one), then predicts each with ``autotune.memory.MemoryModel``
without calibration, as benchmarks/memory_accuracy.py does on CPU ranks: two warm-up steps
and one timed step, since the third step is the first whose peak is steady.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

# fp16 candidates at the smaller micro-batch start their dynamic loss scale here, as
# tests/integration/test_gpu_paths.py does: their first gradients overflow fp16, so the
# scaler must skip those steps and lower the scale, and the check sees it do so
HIGH_SCALE_POWER = 24
PACKAGES = (
    "torch",
    "deepspeed",
    "optuna",
    "optuna-dashboard",
    "transformers",
    "diffusers",
    "pydantic",
    "pydantic-core",
    "sqlalchemy",
    "alembic",
    "numpy",
    "autotune",
)


def _smi(*query: str) -> list[str]:
    """nvidia-smi's CSV answer lines, or [] where it is missing or fails."""
    try:
        out = subprocess.run(
            ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _used_mib() -> float | None:
    lines = _smi("--query-gpu=memory.used")
    return float(lines[0]) if lines else None


def env_facts() -> dict[str, Any]:
    """Versions, the device, and whether autotune's hardware detection (which the driver of
    every run calls) leaves a CUDA context in the driver process: that memory would count
    as overhead in every probe on the same GPU."""
    facts: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable}
    for name in PACKAGES:
        try:
            facts[name] = version(name)
        except PackageNotFoundError:
            facts[name] = None
    before = _used_mib()
    from autotune.hardware import detect

    hardware = detect()
    after = _used_mib()
    facts["hardware"] = hardware.model_dump()
    facts["detect_context_mib"] = (
        None if before is None or after is None else round(after - before, 1)
    )
    import torch

    facts["torch_cuda"] = torch.version.cuda
    if hardware.accelerator == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts["capability"] = f"{props.major}.{props.minor}"
        facts["cudnn"] = torch.backends.cudnn.version()
        nccl = torch.cuda.nccl.version()  # a tuple in current torch, an int in old ones
        facts["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    smi = _smi("--query-gpu=name,driver_version,memory.total")
    if smi:
        name, driver, total = (part.strip() for part in smi[0].split(","))
        facts.update(smi_name=name, driver=driver, smi_memory_total_mib=float(total))
    from autotune.workloads import WORKLOADS

    facts["dit_workloads"] = sorted(name for name in WORKLOADS if name.startswith("dit-"))
    return facts


def build_op(name: str) -> int:
    """Build (or find cached) one DeepSpeed op in autotune's op folder, under its lock, so
    that the check can build several at once."""
    from autotune.backends.deepspeed import guard_op_loads

    guard_op_loads()
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(name)
    if builder is None:
        print(f"{name}: none for this accelerator")
        return 3
    if not builder.is_compatible(verbose=False):
        print(f"{name}: not compatible here (e.g. libaio missing for AsyncIOBuilder)")
        return 3
    builder.load(verbose=False)
    print(f"{name}: loaded")
    return 0


# ---------------------------------------------------------------- memory


def design(precisions: tuple[str, str], micro_batches: tuple[int, int], which: str) -> list:
    """bf16 and fp16 x ZeRO 0-3 x two micro-batches x checkpointing. The half design (16)
    pairs each precision's micro-batches with checkpointing the other way round, so every
    level of every factor appears equally often; the full one has all 32."""
    from autotune.candidate import Candidate

    if which == "none":
        return []
    full = which == "full"
    small, large = micro_batches
    chosen = []
    for index, precision in enumerate(precisions):
        pairs = [(small, False), (large, True)] if index == 0 else [(small, True), (large, False)]
        if full:
            pairs = [(m, c) for m in micro_batches for c in (False, True)]
        for stage in (0, 1, 2, 3):
            for micro_batch, checkpointing in pairs:
                chosen.append(
                    Candidate(
                        precision=precision,
                        zero_stage=stage,
                        micro_batch_size=micro_batch,
                        gradient_accumulation_steps=1,
                        data_parallel_size=1,
                        activation_checkpointing=checkpointing,
                    )
                )
    return chosen


def offload_extras(precision: str, micro_batch: int, which: str) -> list:
    """Optimizer offload to pinned CPU memory at ZeRO-2 and (with parameters) ZeRO-3
    (``cpu``), both to NVMe at ZeRO-3 (``nvme``: on a GPU node a launch of its own, since
    swapping to an unknown disk may be slow), or all three (``both``, last in the launch)."""
    from autotune.candidate import Candidate

    shapes = {
        "cpu": [("cpu", "none", 2), ("cpu", "cpu", 3)],
        "nvme": [("nvme", "nvme", 3)],
        "both": [("cpu", "none", 2), ("cpu", "cpu", 3), ("nvme", "nvme", 3)],
        "none": [],
    }[which]
    return [
        Candidate(
            precision=precision,
            zero_stage=stage,
            offload_optimizer=optimizer,
            offload_param=param,
            micro_batch_size=micro_batch,
            gradient_accumulation_steps=1,
            data_parallel_size=1,
        )
        for optimizer, param, stage in shapes
    ]


def _jobs(args: argparse.Namespace, candidates: list, root: Path) -> list:
    from autotune.backends import get_backend
    from autotune.backends.deepspeed import use_torch_adam
    from autotune.execution import ProbeJob
    from autotune.memory import largest_layer_params
    from autotune.protocol import ProbeSpec
    from autotune.workloads import get_workload

    workload = get_workload(args.workload)
    largest = largest_layer_params(workload)
    jobs = []
    for index, candidate in enumerate(candidates):
        name = f"{index:02d}-{candidate.label.replace(' ', '_').replace(':', '-')}"
        nvme = "nvme" in (candidate.offload_optimizer, candidate.offload_param)
        scratch = str(Path(args.nvme) / name) if nvme else None
        config = get_backend("deepspeed").render_config(
            candidate, nvme_path=scratch, largest_param_numel=largest
        )
        if args.torch_adam:
            config = use_torch_adam(config)
        if candidate.precision == "fp16" and candidate.micro_batch_size == min(args.micro_batches):
            config["fp16"] = {**config.get("fp16", {}), "initial_scale_power": HIGH_SCALE_POWER}
        spec = ProbeSpec(
            workload=args.workload,
            candidate=candidate,
            ds_config=config,
            accelerator=args.accelerator,
            vram_limit_bytes=args.vram,
            device_memory_bytes=args.device_memory,
            tokens_per_sample=workload.tokens_per_sample,
            warmup_steps=2,
            timed_steps=1,
        )
        jobs.append(
            ProbeJob(
                spec=spec,
                trial_dir=str(root / name),
                world_size=1,
                timeout_s=args.timeout_s,
                threads_per_rank=args.threads,
                cwd=str(root),
                scratch_dir=scratch,
            )
        )
    return jobs


def _launch_all(jobs: list) -> list:
    """launch_probes, continuing in a fresh launch after a candidate that ended one."""
    from autotune.execution import launch_probes

    results: list = []
    while len(results) < len(jobs):
        batch = launch_probes(jobs[len(results) :])
        for result in batch:
            if result.error.startswith("not probed: the launch stopped"):
                break
            results.append(result)
    return results


def memory(args: argparse.Namespace) -> int:
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    precisions = tuple(args.precisions)
    mbs = tuple(args.micro_batches)
    chosen = design(precisions, mbs, args.design)  # type: ignore[arg-type]
    extras = offload_extras(precisions[0], mbs[0], args.extras)
    jobs = _jobs(args, chosen + extras, root)
    results = _launch_all(jobs)
    # predicted after the probes: on a CUDA host the trace must not hold a context while
    # the probes measure the memory outside their allocator
    from autotune.memory import MemoryModel
    from autotune.workloads import get_workload

    model = MemoryModel(get_workload(args.workload), accelerator=args.accelerator)
    rows = [
        memory_row(job, result, model, args.accelerator, design=index < len(chosen))
        for index, (job, result) in enumerate(zip(jobs, results, strict=True))
    ]
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"{sum(r['status'] == 'ok' for r in rows)} of {len(rows)} candidates measured")
    return 0


def memory_row(job: Any, result: Any, model: Any, accelerator: str, design: bool) -> dict:
    """One candidate's row: what it was, what the model predicted, what its probe measured
    and what its rank read of its engine."""
    from autotune.execution import read_reports

    candidate = job.spec.candidate
    estimate = model.predict(candidate)
    reports = read_reports(job)
    report = reports[0] if reports else None
    overhead = (result.overhead_bytes_per_rank or [0])[0]
    reserved = (result.reserved_bytes_per_rank or [0])[0]
    zero = job.spec.ds_config.get("zero_optimization", {})
    offload = zero.get("offload_optimizer") or zero.get("offload_param") or {}
    fp16 = job.spec.ds_config.get("fp16", {})
    return {
        "label": candidate.label,
        "design": design,
        "precision": candidate.precision,
        "zero_stage": candidate.zero_stage,
        "micro_batch_size": candidate.micro_batch_size,
        "activation_checkpointing": candidate.activation_checkpointing,
        "offload_optimizer": candidate.offload_optimizer,
        "offload_param": candidate.offload_param,
        "pin_memory": offload.get("pin_memory"),
        "loss_scale": fp16.get("loss_scale"),
        "initial_scale_power": fp16.get("initial_scale_power"),
        "vram_limit_bytes": job.spec.vram_limit_bytes,
        "status": result.status,
        "error": result.error,
        "predicted_bytes": estimate.tracked_bytes(accelerator),
        "predicted_host_bytes": estimate.host_bytes,
        "phase": estimate.phase,
        "allocated_bytes": (result.peak_bytes_per_rank or [0])[0],
        # the caching allocator's own peak: the probe adds the context overhead
        "reserved_bytes": max(reserved - overhead, 0) if reserved else 0,
        "overhead_bytes": overhead,
        "host_peak_bytes": (result.host_peak_bytes_per_rank or [0])[0],
        "skipped_steps": result.skipped_steps,
        "samples_per_s": result.samples_per_s,
        "leaked_bytes": report.leaked_bytes if report else None,
        **engine_state(report),
        "cold_start": result.cold_start,
        "wall_s": result.wall_s,
    }


ENGINE_STATE = (
    "pinned_host_bytes_at_start",
    "pinned_host_bytes_at_end",
    "offloaded_pinned_bytes",
    "offloaded_pageable_bytes",
    "loss_scale_at_start",
    "loss_scale_at_end",
    "optimizer",
)


def engine_state(report: Any) -> dict[str, Any]:
    """What the rank read of its engine (autotune.protocol.RankReport): pinned host memory,
    the optimizer's host tensors, the fp16 loss scale, the optimizer that stepped."""
    return {key: getattr(report, key) if report else None for key in ENGINE_STATE}


def _stop(signum: int, frame: Any) -> None:
    """Killed by the check's phase timeout: take the probes' process groups along."""
    from autotune.execution import kill_all_groups

    kill_all_groups()
    os._exit(124)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env")
    op = sub.add_parser("build-op")
    op.add_argument("name")
    mem = sub.add_parser("memory")
    mem.add_argument("--out", required=True)
    mem.add_argument("--root", required=True)
    mem.add_argument("--workload", required=True)
    mem.add_argument("--accelerator", choices=("cuda", "cpu"), required=True)
    mem.add_argument("--precisions", nargs=2, default=["bf16", "fp16"])
    mem.add_argument("--micro-batches", nargs=2, type=int, required=True)
    mem.add_argument("--design", choices=("half", "full", "none"), default="half")
    mem.add_argument("--extras", choices=("cpu", "nvme", "both", "none"), default="cpu")
    mem.add_argument("--vram", type=int, required=True, help="limit per rank, bytes")
    mem.add_argument("--device-memory", type=int, required=True)
    mem.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    mem.add_argument("--timeout-s", type=float, default=300.0)
    mem.add_argument("--nvme", default="", help="folder for NVMe swap files (--extras nvme)")
    mem.add_argument("--torch-adam", action="store_true")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if args.command == "env":
        print(json.dumps(env_facts()))
        return 0
    if args.command == "build-op":
        return build_op(args.name)
    return memory(args)


if __name__ == "__main__":
    sys.exit(main())
