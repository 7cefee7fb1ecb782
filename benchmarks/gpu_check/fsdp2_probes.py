"""The GPU check's FSDP2 steps, run inside its environment like probes.py (they import
autotune and torch); the fsdp2 phase starts each as a subprocess, by this file's path.

    python benchmarks/gpu_check/fsdp2_probes.py predict --out P.json --workload gpt2 ...
    python benchmarks/gpu_check/fsdp2_probes.py probe --candidates P.json --out rows.json \\
        --export DIR ...

``predict`` writes FSDP2's candidates with what ``autotune.memory.MemoryModel`` predicts of
each (in a process that ends before any probe, as probes.py's): ``fully_shard`` per
transformer block, CPU offload off and on, gradients reduced after every micro-batch or
only at the last (two micro-batches a step), gradient clipping on. ``probe`` probes them in
one warm launch, three optimizer steps each, through autotune's FSDP2 backend as a study
would (``autotune.backends.get_backend("fsdp2")``), records each rank's view of how its
engine sharded the model, and writes the export of the offloading candidate reduced after
every micro-batch as the backend writes it: its config file and ``launch.sh``, which the
phase then runs with train_fsdp2.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import probes

# the base config's gradient clipping: FSDP2's engine then clips before each step, which
# gathers the gradient shards' norm (on the host under CPU offload)
CLIPPING = 1.0
# each candidate accumulates this many micro-batches, so that both gradient-sync modes
# differ (set_requires_gradient_sync)
ACCUMULATION = 2
# (warm-up, timed) optimizer steps of each probe: the third step is the first whose peak is
# steady, the peak the memory model predicts (probes.py's and
# benchmarks/memory_accuracy/memory_accuracy.py's probes measure the same way)
STEPS = (2, 1)
# the candidate whose export the phase trains: offload and clipping, reduced after each
EXPORTED = {"cpu_offload": True, "sync_each_micro_batch": True}


def fsdp2_candidates(precision: str, micro_batch: int, ranks: int) -> list[Any]:
    """Per block, resharded after forward; CPU offload off and on; reduced after every
    micro-batch and only at the last."""
    from autotune.candidate import Candidate, FsdpKnobs

    return [
        Candidate(
            backend="fsdp2",
            precision=precision,
            zero_stage=3,
            offload_optimizer=offload,
            offload_param=offload,
            micro_batch_size=micro_batch,
            gradient_accumulation_steps=ACCUMULATION,
            data_parallel_size=ranks,
            fsdp=FsdpKnobs(wrap="block", reshard_after_forward=True, sync_each_micro_batch=each),
        )
        for offload in ("none", "cpu")
        for each in (False, True)
    ]


def predict(args: argparse.Namespace) -> int:
    chosen = [(c, False) for c in fsdp2_candidates(args.precision, args.micro_batch, args.ranks)]
    entries = probes.predictions(chosen, args.workload, args.accelerator)
    Path(args.out).write_text(json.dumps(entries))
    print(f"{len(entries)} FSDP2 candidates predicted")
    return 0


def model_units(workload_name: str) -> tuple[int, str]:
    """The units ``fully_shard`` is applied to per block (the workload's blocks and the
    root) and the blocks' class, from the model built on the meta device."""
    import torch

    from autotune.workloads import get_workload
    from autotune.workloads.blocks import shard_units

    workload = get_workload(workload_name)
    with torch.device("meta"):
        model = workload.build_model()
    units = shard_units(workload, model)
    return len(units) + 1, type(units[-1]).__name__ if units else ""


def probe(args: argparse.Namespace) -> int:
    from autotune.backends import get_backend

    backend = get_backend("fsdp2")
    Path(args.root).mkdir(parents=True, exist_ok=True)
    chosen = probes.read_candidates(args.candidates)
    jobs = []
    for index, (candidate, _) in enumerate(chosen):
        config = backend.render_config(candidate, {"gradient_clipping": CLIPPING})
        spec = probes.probe_spec(args, candidate, config, STEPS)
        jobs.append(probes.probe_job(args, spec, probes.folder_name(index, candidate)))
    results = probes.launch_all(jobs)
    units, block_class = model_units(args.workload)
    rows = [
        fsdp2_row(job, result, entry, units)
        for job, result, (_, entry) in zip(jobs, results, chosen, strict=True)
    ]
    Path(args.out).write_text(json.dumps(rows, indent=1))
    write_export(args, exported_job(jobs).spec.backend_config, backend, block_class)
    print(f"{sum(r['status'] == 'ok' for r in rows)} of {len(rows)} FSDP2 candidates measured")
    return 0


def exported_job(jobs: list[Any]) -> Any:
    """The job of the candidate whose export the phase trains (:data:`EXPORTED`)."""
    for job in jobs:
        candidate = job.spec.candidate
        knobs = {
            "cpu_offload": candidate.fsdp_cpu_offload,
            "sync_each_micro_batch": candidate.fsdp.sync_each_micro_batch,
        }
        if knobs == EXPORTED:
            return job
    raise ValueError(f"no FSDP2 candidate with {EXPORTED}")


def fsdp2_row(job: Any, result: Any, entry: dict, units: int) -> dict[str, Any]:
    """One FSDP2 candidate: what it was, the model's prediction, what its probe measured,
    and how each rank's engine sharded the model (its FSDP2 states)."""
    from autotune.execution import read_reports

    candidate = job.spec.candidate
    config = job.spec.backend_config
    reports = read_reports(job)
    return {
        "label": candidate.label,
        "precision": candidate.precision,
        "micro_batch_size": candidate.micro_batch_size,
        "gradient_accumulation_steps": candidate.gradient_accumulation_steps,
        "ranks": job.world_size,
        "wrap": candidate.fsdp.wrap,
        "cpu_offload": candidate.fsdp_cpu_offload,
        "sync_each_micro_batch": candidate.fsdp.sync_each_micro_batch,
        "gradient_clipping": config.get("gradient_clipping", 0.0),
        "vram_limit_bytes": job.spec.vram_limit_bytes,
        "predicted_bytes": entry["predicted_bytes"],
        "predicted_host_bytes": entry["predicted_host_bytes"],
        "phase": entry["phase"],
        **probes.measured(result),
        "expected_units": units,
        "sharding": [r.sharding.model_dump() if r.sharding else None for r in reports],
    }


def write_export(
    args: argparse.Namespace, config: dict[str, Any], backend: Any, block_class: str
) -> None:
    """The backend's export files for ``config`` on ``args.ranks`` ranks: the config,
    ``launch.sh`` and what the backend writes beside them (``block_class``: the class of the
    model's blocks, one unit each)."""
    folder = Path(args.export)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / backend.config_file_name).write_text(json.dumps(config, indent=2))
    launch = backend.launch_script(
        origin="the GPU check's FSDP2 phase",
        ranks=args.ranks,
        accelerator=args.accelerator,
        threads_per_rank=args.threads,
        config=config,
    )
    (folder / "launch.sh").write_text(launch)
    (folder / "launch.sh").chmod(0o755)
    extra = backend.export_files(config, args.ranks, args.accelerator, block_class)
    for name, text in extra.items():
        (folder / name).write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    pred = sub.add_parser("predict")
    pred.add_argument("--out", required=True)
    pred.add_argument("--workload", required=True)
    pred.add_argument("--accelerator", choices=("cuda", "cpu"), required=True)
    pred.add_argument("--ranks", type=int, default=1)
    pred.add_argument("--precision", default="bf16")
    pred.add_argument("--micro-batch", type=int, required=True)
    run = sub.add_parser("probe")
    run.add_argument("--candidates", required=True, help="a predict command's output")
    run.add_argument("--out", required=True)
    run.add_argument("--export", required=True, help="folder for the export's files")
    probes.add_probe_arguments(run)
    args = parser.parse_args(argv)
    probes.stop_on_signals()
    return predict(args) if args.command == "predict" else probe(args)


if __name__ == "__main__":
    sys.exit(main())
