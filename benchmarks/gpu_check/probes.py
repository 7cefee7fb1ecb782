"""The GPU check's steps that run inside its environment (they import autotune, torch and
DeepSpeed); the check's phases start each as a subprocess, by this file's path, and read the
JSON it prints or writes.

    python benchmarks/gpu_check/probes.py env
    python benchmarks/gpu_check/probes.py build-op FusedAdamBuilder
    python benchmarks/gpu_check/probes.py predict --set memory --out P.json --workload gpt2 ...
    python benchmarks/gpu_check/probes.py memory --candidates P.json --out rows.json ...

``predict`` writes the candidates of a set with what ``autotune.memory.MemoryModel``
predicts for each, without calibration: the memory model's design (bf16 and fp16 x ZeRO 0-3
x two micro-batches x activation checkpointing) with the CPU offload extras (``memory``), or
NVMe offload alone (``nvme``). It runs in a process of its own that ends before any probe,
so that no CUDA context of the trace's could count in a probe's memory, and the check sets
the probes' limit from its predictions. ``memory`` probes those candidates in warm launches
(the candidates one after another in the same ranks; a failed candidate ends its launch and
the rest continue in a fresh one), as benchmarks/memory_accuracy/memory_accuracy.py does on
CPU ranks: two warm-up steps and one timed step, since the third step is the first whose
peak is steady. fsdp2_probes.py does the same for FSDP2's candidates.
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
    (``cpu``), or both to NVMe at ZeRO-3 (``nvme``: a phase of its own, since swapping to an
    unknown disk may be slow)."""
    from autotune.candidate import Candidate

    shapes = {"cpu": [("cpu", "none", 2), ("cpu", "cpu", 3)], "nvme": [("nvme", "nvme", 3)]}[which]
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


def candidate_set(args: argparse.Namespace) -> list[tuple[Any, bool]]:
    """The candidates of ``args.set`` at ``args.ranks`` ranks, each with whether it belongs
    to the memory model's design (the offload extras do not)."""
    precisions, mbs = tuple(args.precisions), tuple(args.micro_batches)
    if args.set == "nvme":
        chosen = [(c, False) for c in offload_extras(precisions[0], mbs[0], "nvme")]
    else:
        chosen = [(c, True) for c in design(precisions, mbs, args.design)]  # type: ignore[arg-type]
        chosen += [(c, False) for c in offload_extras(precisions[0], mbs[0], "cpu")]
    return [(c.model_copy(update={"data_parallel_size": args.ranks}), d) for c, d in chosen]


def predictions(chosen: list[tuple[Any, bool]], workload: str, accelerator: str) -> list[dict]:
    """Each candidate (JSON) with what the memory model predicts of it: the bytes the
    probe tracks (the device's on CUDA; device and host in one RAM on CPU ranks), the
    host's, and the phase of the step that peaks."""
    from autotune.memory import MemoryModel
    from autotune.workloads import get_workload

    model = MemoryModel(get_workload(workload), accelerator=accelerator)
    out = []
    for candidate, in_design in chosen:
        estimate = model.predict(candidate)
        out.append(
            {
                "candidate": candidate.model_dump(mode="json"),
                "label": candidate.label,
                "design": in_design,
                "predicted_bytes": estimate.tracked_bytes(accelerator),
                "predicted_host_bytes": estimate.host_bytes,
                "phase": estimate.phase,
            }
        )
    return out


def predict(args: argparse.Namespace) -> int:
    chosen = candidate_set(args)
    Path(args.out).write_text(json.dumps(predictions(chosen, args.workload, args.accelerator)))
    print(f"{len(chosen)} candidates predicted")
    return 0


def probe_spec(args: argparse.Namespace, candidate: Any, config: dict, steps: tuple[int, int]):
    """The probe of ``candidate`` with ``config`` under the phase's limit, for ``steps``
    (warm-up, timed) optimizer steps."""
    from autotune.protocol import ProbeSpec
    from autotune.workloads import get_workload

    return ProbeSpec(
        workload=args.workload,
        candidate=candidate,
        backend_config=config,
        accelerator=args.accelerator,
        vram_limit_bytes=args.vram,
        device_memory_bytes=args.device_memory,
        tokens_per_sample=get_workload(args.workload).tokens_per_sample,
        warmup_steps=steps[0],
        timed_steps=steps[1],
    )


def probe_job(args: argparse.Namespace, spec: Any, name: str, scratch: str | None = None):
    """``spec`` run on ``args.ranks`` ranks in its own folder under ``args.root``."""
    from autotune.execution import ProbeJob

    return ProbeJob(
        spec=spec,
        trial_dir=str(Path(args.root) / name),
        world_size=args.ranks,
        timeout_s=args.timeout_s,
        threads_per_rank=args.threads,
        cwd=str(args.root),
        scratch_dir=scratch,
    )


def folder_name(index: int, candidate: Any) -> str:
    return f"{index:02d}-{candidate.label.replace(' ', '_').replace(':', '-')}"


def _jobs(args: argparse.Namespace, candidates: list) -> list:
    from autotune.backends import get_backend
    from autotune.backends.deepspeed import use_torch_adam
    from autotune.memory import largest_layer_params
    from autotune.workloads import get_workload

    largest = largest_layer_params(get_workload(args.workload))
    high_scale = min((c.micro_batch_size for c in candidates if c.precision == "fp16"), default=0)
    jobs = []
    for index, candidate in enumerate(candidates):
        name = folder_name(index, candidate)
        nvme = "nvme" in (candidate.offload_optimizer, candidate.offload_param)
        scratch = str(Path(args.nvme) / name) if nvme else None
        config = get_backend("deepspeed").render_config(
            candidate, nvme_path=scratch, largest_param_numel=largest
        )
        if args.torch_adam:
            config = use_torch_adam(config)
        if candidate.precision == "fp16" and candidate.micro_batch_size == high_scale:
            config["fp16"] = {**config.get("fp16", {}), "initial_scale_power": HIGH_SCALE_POWER}
        jobs.append(probe_job(args, probe_spec(args, candidate, config, (2, 1)), name, scratch))
    return jobs


def launch_all(jobs: list) -> list:
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


def read_candidates(path: str) -> list[tuple[Any, dict]]:
    """The candidates a ``predict`` file lists, each with its entry."""
    from autotune.candidate import Candidate

    entries = json.loads(Path(path).read_text())
    return [(Candidate.model_validate(e["candidate"]), e) for e in entries]


def memory(args: argparse.Namespace) -> int:
    Path(args.root).mkdir(parents=True, exist_ok=True)
    chosen = read_candidates(args.candidates)
    jobs = _jobs(args, [c for c, _ in chosen])
    results = launch_all(jobs)
    rows = [
        memory_row(job, result, entry, args.accelerator)
        for job, result, (_, entry) in zip(jobs, results, chosen, strict=True)
    ]
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"{sum(r['status'] == 'ok' for r in rows)} of {len(rows)} candidates measured")
    return 0


def measured(result: Any) -> dict[str, Any]:
    """What a probe measured of its ranks' memory (the largest rank's): allocated peak, the
    caching allocator's peak without the context overhead (CUDA), the overhead, the host."""
    overhead = max(result.overhead_bytes_per_rank or [0])
    reserved = max(result.reserved_bytes_per_rank or [0])
    return {
        "status": result.status,
        "error": result.error,
        "allocated_bytes": max(result.peak_bytes_per_rank or [0]),
        # the caching allocator's own peak: the probe adds the context overhead
        "reserved_bytes": max(reserved - overhead, 0) if reserved else 0,
        "overhead_bytes": overhead,
        "host_peak_bytes": max(result.host_peak_bytes_per_rank or [0]),
        "samples_per_s": result.samples_per_s,
        "cold_start": result.cold_start,
        "wall_s": result.wall_s,
    }


def memory_row(job: Any, result: Any, entry: dict, accelerator: str) -> dict:
    """One candidate's row: what it was, what the model predicted, what its probe measured
    and what its rank read of its engine."""
    from autotune.execution import read_reports

    candidate = job.spec.candidate
    reports = read_reports(job)
    report = reports[0] if reports else None
    zero = job.spec.backend_config.get("zero_optimization", {})
    offload = zero.get("offload_optimizer") or zero.get("offload_param") or {}
    fp16 = job.spec.backend_config.get("fp16", {})
    return {
        "label": candidate.label,
        "design": entry["design"],
        "precision": candidate.precision,
        "zero_stage": candidate.zero_stage,
        "micro_batch_size": candidate.micro_batch_size,
        "activation_checkpointing": candidate.activation_checkpointing,
        "offload_optimizer": candidate.offload_optimizer,
        "offload_param": candidate.offload_param,
        "ranks": job.world_size,
        "pin_memory": offload.get("pin_memory"),
        "loss_scale": fp16.get("loss_scale"),
        "initial_scale_power": fp16.get("initial_scale_power"),
        "vram_limit_bytes": job.spec.vram_limit_bytes,
        "predicted_bytes": entry["predicted_bytes"],
        "predicted_host_bytes": entry["predicted_host_bytes"],
        "phase": entry["phase"],
        **measured(result),
        "skipped_steps": result.skipped_steps,
        "leaked_bytes": max((r.leaked_bytes for r in reports), default=None),
        **engine_state(report),
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


def stop_on_signals() -> None:
    """Stopped by the check's phase limit (SIGTERM, SIGINT): the probes' process groups
    end with this process."""
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)


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
    pred = sub.add_parser("predict")
    pred.add_argument("--set", choices=("memory", "nvme"), required=True)
    pred.add_argument("--out", required=True)
    pred.add_argument("--workload", required=True)
    pred.add_argument("--accelerator", choices=("cuda", "cpu"), required=True)
    pred.add_argument("--ranks", type=int, default=1)
    pred.add_argument("--precisions", nargs=2, default=["bf16", "fp16"])
    pred.add_argument("--micro-batches", nargs=2, type=int, required=True)
    pred.add_argument("--design", choices=("half", "full"), default="half")
    mem = sub.add_parser("memory")
    mem.add_argument("--candidates", required=True, help="a predict command's output")
    mem.add_argument("--out", required=True)
    add_probe_arguments(mem)
    mem.add_argument("--nvme", default="", help="folder for NVMe swap files")
    mem.add_argument("--torch-adam", action="store_true")
    args = parser.parse_args(argv)
    stop_on_signals()
    if args.command == "env":
        print(json.dumps(env_facts()))
        return 0
    if args.command == "build-op":
        return build_op(args.name)
    if args.command == "predict":
        return predict(args)
    return memory(args)


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    """What a command that probes takes: where, the workload, the ranks, the limit."""
    parser.add_argument("--root", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--accelerator", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--vram", type=int, required=True, help="limit per rank, bytes")
    parser.add_argument("--device-memory", type=int, required=True)
    parser.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1))
    parser.add_argument("--timeout-s", type=float, default=300.0)


if __name__ == "__main__":
    sys.exit(main())
