"""Predicted vs measured peak memory per rank, on 2 CPU ranks.

For each workload, every candidate of ZeRO 0-3 x fp32/bf16 x two micro-batches x
activation checkpointing off/on is probed for real (DeepSpeed, 2 ranks, the probe's tensor
tracker over initialisation and two optimizer steps; all candidates of a workload in one
torchrun launch) and predicted by ``autotune.memory.MemoryModel`` with no calibration.

Reproduce:
    python benchmarks/memory_accuracy/memory_accuracy.py   # gpt-tiny and GPT-2 124M (seq 32)
    python benchmarks/memory_accuracy/memory_accuracy.py --workloads gpt-tiny
    python benchmarks/memory_accuracy/memory_accuracy.py --workloads dit-s-8 dit-s-2 dit-b-8 \
        --out benchmarks/memory_accuracy/data/memory_accuracy_dit.json   # diffusion transformers
    python benchmarks/memory_accuracy/memory_accuracy.py \
        --repredict benchmarks/memory_accuracy/data/memory_accuracy.json
        # the measured peaks of an earlier run against the current model (no probes)
    python benchmarks/memory_accuracy/memory_accuracy.py \
        --repredict benchmarks/memory_accuracy/data/memory_accuracy.json \
        benchmarks/memory_accuracy/data/memory_accuracy_gpt2.json \
        benchmarks/memory_accuracy/data/memory_accuracy_dit.json \
        --out benchmarks/memory_accuracy/data/memory_accuracy_repredicted.json
        # the same, written as JSON: every row and each file's workload's summary
    python benchmarks/memory_accuracy/memory_accuracy.py --workloads dit-s-8 dit-s-2 dit-b-8 \
        --stages 1 2 --precisions bf16 --out /tmp/z12.json   # a part of the grid
    python benchmarks/memory_accuracy/memory_accuracy.py --backend fsdp2 \
        --workloads gpt-tiny gpt2-seq32 dit-s-8 \
        --out benchmarks/memory_accuracy/data/memory_accuracy_fsdp2.json
        # FSDP2: fp32/bf16 x micro-batches x checkpointing x (reshard after forward, keep
        # gathered, one unit) x CPU offload off/on
    python benchmarks/memory_accuracy/memory_accuracy.py --workloads dit-s-8 gpt2-seq32 \
        --stages 0 3 --precisions fp32 --micro-batches 4 2 --fractions 0 0.25 0.5 0.75 1 \
        --policies full selective \
        --out benchmarks/memory_accuracy/data/memory_accuracy_dial.json
    python benchmarks/memory_accuracy/memory_accuracy.py --backend fsdp2 \
        --workloads dit-s-8 gpt2-seq32 --precisions fp32 --micro-batches 4 2 \
        --shardings reshard keep \
        --offloads none --fractions 0 0.25 0.5 0.75 1 --policies full selective \
        --out benchmarks/memory_accuracy/data/memory_accuracy_fsdp2_dial.json
        # the activation dial: every (checkpoint_fraction, checkpoint_policy), fraction 0
        # with no policy; --micro-batches gives each workload's, in --workloads' order; fp32
        # (these AVX2 CPUs emulate bf16, a probe of it takes minutes)

Targets: language models median relative error <= 5%, worst <= 15%, no candidate
under-predicted by more than 5%; DiT median <= 2%, worst <= 5%, under-prediction <= 2%.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.memory import MemoryModel

# run by path, this folder is first on sys.path; the repository root makes the
# benchmarks importable as the package ``benchmarks`` (as the tests import them)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

HERE = Path(__file__).resolve().parent
WORKLOADS = {
    # name: (workload reference, global batch, micro-batches)
    "gpt-tiny": ("gpt-tiny", 16, (2, 4)),
    "gpt2-seq32": (f"{HERE.parent / 'workloads.py'}:gpt2_seq32", 4, (1, 2)),
    # DiT-S/8 (40M parameters, 16 tokens): model states dominate
    "dit-s-8": ("dit-s-8", 16, (2, 4)),
    # DiT-S/2 (40M parameters, 256 tokens): activations are a large share of the peak
    "dit-s-2": ("dit-s-2", 4, (1, 2)),
    # DiT-B/8 (148M parameters, 16 tokens)
    "dit-b-8": ("dit-b-8", 16, (2, 4)),
    "dit-tiny": ("dit-tiny", 16, (2, 4)),
}
DEFAULT_WORKLOADS = ("gpt-tiny", "gpt2-seq32")
# (median |error|, worst |error|, worst under-prediction) a family must meet
TARGETS = {"lm": (0.05, 0.15, 0.05), "dit": (0.02, 0.05, 0.02)}


# FSDP2's sharding choices probed, by name: (reshard_after_forward, wrap, sync_each_micro_batch)
SHARDINGS = {
    "reshard": (True, "block", False),
    "keep": (False, "block", False),
    "model": (False, "model", False),
    "reshard-sync": (True, "block", True),
    "keep-sync": (False, "block", True),
}


@dataclasses.dataclass(frozen=True)
class Grid:
    """The candidates probed of a workload: each axis's values (``candidates`` takes the
    product); the recomputation axis is every (fraction, policy) with a policy only where
    some block is recomputed."""

    stages: tuple[int, ...] = (0, 1, 2, 3)
    precisions: tuple[str, ...] = ("fp32", "bf16")
    backend: str = "deepspeed"
    fractions: tuple[float, ...] = (0.0, 1.0)
    policies: tuple[str, ...] = ("full",)
    shardings: tuple[str, ...] = tuple(SHARDINGS)
    offloads: tuple[str, ...] = ("none", "cpu")

    def recomputations(self) -> list[tuple[float, str]]:
        return [
            (fraction, policy)
            for fraction in self.fractions
            for policy in self.policies
            if fraction > 0 or policy == "full"
        ]


def candidates(global_batch: int, micro_batches: tuple[int, ...], grid: Grid = Grid()):
    from autotune.candidate import Candidate

    if grid.backend == "fsdp2":
        yield from fsdp2_candidates(global_batch, micro_batches, grid)
        return
    for stage, precision, mb, (fraction, policy) in itertools.product(
        grid.stages, grid.precisions, micro_batches, grid.recomputations()
    ):
        yield Candidate(
            precision=precision,
            zero_stage=stage,
            micro_batch_size=mb,
            gradient_accumulation_steps=global_batch // (2 * mb),
            data_parallel_size=2,
            checkpoint_fraction=fraction,
            checkpoint_policy=policy,
        )


def fsdp2_candidates(global_batch: int, micro_batches: tuple[int, ...], grid: Grid):
    from autotune.candidate import Candidate, FsdpKnobs

    shardings = [
        FsdpKnobs(reshard_after_forward=reshard, wrap=wrap, sync_each_micro_batch=sync)
        for reshard, wrap, sync in (SHARDINGS[name] for name in grid.shardings)
    ]
    for precision, mb, (fraction, policy), knobs, offload in itertools.product(
        grid.precisions, micro_batches, grid.recomputations(), shardings, grid.offloads
    ):
        if knobs.sync_each_micro_batch and global_batch == 2 * mb:
            continue  # one micro-batch per step: nothing to sync between
        yield Candidate(
            backend="fsdp2",
            precision=precision,
            zero_stage=3,
            micro_batch_size=mb,
            gradient_accumulation_steps=global_batch // (2 * mb),
            data_parallel_size=2,
            checkpoint_fraction=fraction,
            checkpoint_policy=policy,
            offload_optimizer=offload,
            offload_param=offload,
            fsdp=knobs,
        )


def measure(
    ref: str,
    batch: int,
    mbs: tuple[int, ...],
    root: Path,
    warmup_steps: int = 2,
    grid: Grid = Grid(),
) -> list[tuple]:
    from autotune.execution import launch_probes
    from autotune.memory import MemoryModel
    from autotune.workloads import get_workload
    from benchmarks.probe_jobs import cpu_probe_jobs

    model = MemoryModel(get_workload(ref))
    chosen = list(candidates(batch, mbs, grid))
    predictions = []
    for candidate in chosen:
        started = time.perf_counter()
        estimate = model.predict(candidate)
        predictions.append((estimate, time.perf_counter() - started))
    # the third step is the first whose peak is steady: the second already has optimizer
    # states, but GPT-2's steps 1-2 peak 4 bytes x parameters below step 3 (measured)
    jobs = cpu_probe_jobs(
        ref, chosen, root, warmup_steps=warmup_steps, timed_steps=1, timeout_s=900
    )
    results = launch_probes(jobs)
    rows = []
    for job, (estimate, predict_s), result in zip(jobs, predictions, results, strict=True):
        measured = max(result.peak_bytes_per_rank or [0])
        rows.append((job.spec.candidate, estimate, predict_s, result, measured))
    return rows


def main() -> int:
    args = parse_args()
    if args.repredict:
        return repredict(args.repredict, args.out)
    if args.micro_batches and len(args.micro_batches) != len(args.workloads):
        raise SystemExit("--micro-batches: give one micro-batch per workload of --workloads")
    out = args.out or HERE / "data" / "memory_accuracy.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    records = []
    for index, name in enumerate(args.workloads):
        micro_batches = (args.micro_batches[index],) if args.micro_batches else None
        records += measure_workload(name, args, micro_batches)
        if records:  # each workload's records kept as soon as they are measured
            out.write_text(json.dumps(records, indent=1))
    errors = [(r["predicted_bytes"] - r["measured_bytes"]) / r["measured_bytes"] for r in records]
    if not errors:
        return 1
    _summary(errors, args.workloads)
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workloads", nargs="+", default=list(DEFAULT_WORKLOADS), choices=WORKLOADS
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="where the probes' records go (default "
        "benchmarks/memory_accuracy/data/memory_accuracy.json); with --repredict, where the "
        "re-predictions are written as JSON (default: printed only)",
    )
    parser.add_argument(
        "--repredict", type=Path, nargs="+", help="JSON of earlier runs: predict again, no probe"
    )
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=2,
        help="steps before the timed one; below 2 the peak is not yet steady (a 2-step "
        "probe of GPT-2 peaks 4 bytes x parameters lower than the third step does)",
    )
    parser.add_argument(
        "--stages", type=int, nargs="+", default=[0, 1, 2, 3], help="ZeRO stages to probe"
    )
    parser.add_argument(
        "--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"]
    )
    parser.add_argument(
        "--backend",
        default="deepspeed",
        choices=["deepspeed", "fsdp2"],
        help="the training backend whose candidates are probed (fsdp2: no --stages)",
    )
    _grid_arguments(parser)
    return parser.parse_args()


def _grid_arguments(parser: argparse.ArgumentParser) -> None:
    """The grid's axes past stage and precision: micro-batches, the activation dial's
    shares and policies, and FSDP2's shardings and offloads."""
    parser.add_argument(
        "--micro-batches",
        type=int,
        nargs="+",
        help="one micro-batch per workload, in --workloads' order (default: each workload's two)",
    )
    parser.add_argument(
        "--fractions",
        type=float,
        nargs="+",
        default=[0.0, 1.0],
        help="checkpoint_fraction values probed (default 0 1: the switch off and on)",
    )
    parser.add_argument(
        "--policies",
        nargs="+",
        default=["full"],
        choices=["full", "selective"],
        help="checkpoint_policy values probed where the fraction is above 0",
    )
    parser.add_argument(
        "--shardings",
        nargs="+",
        default=list(SHARDINGS),
        choices=list(SHARDINGS),
        help="FSDP2 sharding choices probed (fsdp2 only)",
    )
    parser.add_argument(
        "--offloads",
        nargs="+",
        default=["none", "cpu"],
        choices=["none", "cpu"],
        help="FSDP2 parameter and optimizer offload probed (fsdp2 only)",
    )


def measure_workload(
    name: str, args: argparse.Namespace, micro_batches: tuple[int, ...] | None = None
) -> list[dict]:
    """Probe and predict workload ``name``'s candidates (at ``micro_batches``, else its
    own); print its table, and return a record of each candidate measured."""
    ref, batch, mbs = WORKLOADS[name]
    grid = Grid(
        stages=tuple(args.stages),
        precisions=tuple(args.precisions),
        backend=args.backend,
        fractions=tuple(args.fractions),
        policies=tuple(args.policies),
        shardings=tuple(args.shardings),
        offloads=tuple(args.offloads),
    )
    with tempfile.TemporaryDirectory(prefix="autotune-memory-") as tmp:
        rows = measure(ref, batch, micro_batches or mbs, Path(tmp), args.warmup_steps, grid)
    print(f"\n## {name} (global batch {batch}, 2 CPU ranks)\n")
    print("| candidate | phase | predicted MiB | measured MiB | error |")
    print("|---|---|---|---|---|")
    records = []
    for candidate, estimate, predict_s, result, measured in rows:
        predicted = estimate.tracked_bytes("cpu")
        if result.status != "ok" or not measured:
            print(
                f"| {candidate.label} | {estimate.phase} | {predicted / 2**20:.1f} | "
                f"{result.status}: {result.error[:60]} | |"
            )
            continue
        error = (predicted - measured) / measured
        records.append(
            {
                "candidate_json": candidate.model_dump(mode="json"),
                "workload": name,
                "candidate": candidate.label,
                "predicted_bytes": predicted,
                "measured_bytes": measured,
                "phase": estimate.phase,
                "predict_s": predict_s,
                "measured_on": datetime.date.today().isoformat(),
            }
        )
        print(
            f"| {candidate.label} | {estimate.phase} | {predicted / 2**20:.1f} | "
            f"{measured / 2**20:.1f} | {100 * error:+.1f}% |"
        )
    return records


def repredict(paths: list[Path], out: Path | None = None) -> int:
    """The measured peaks of earlier runs against the current model, printed per workload
    and (with ``out``) written as JSON: each row, and each file's workload's summary."""
    from autotune.memory import MemoryModel
    from autotune.workloads import get_workload

    errors: list[float] = []
    names: list[str] = []
    document: dict[str, list[dict]] = {"summaries": [], "rows": []}
    for path in paths:
        records = json.loads(path.read_text())
        by_workload: dict[str, list[dict]] = {}
        for record in records:
            by_workload.setdefault(record["workload"], []).append(record)
        for name, rows in by_workload.items():
            names.append(name)
            print(f"\n## {name} (re-predicted from {path.name})\n")
            print("| candidate | phase | predicted MiB | measured MiB | error |")
            print("|---|---|---|---|---|")
            model = MemoryModel(get_workload(WORKLOADS[name][0]))
            predicted = [repredict_row(model, name, record) for record in rows]
            for row in predicted:
                row["measured_in"] = path.name
            errors += [row["error"] for row in predicted]
            document["rows"] += predicted
            summary = {"file": path.name, "workload": name, **_errors_summary(predicted)}
            document["summaries"].append(summary)
    _summary(errors, names)
    if out is not None:
        out.write_text(json.dumps(document, indent=1) + "\n")
    return 0


def repredict_row(model: MemoryModel, name: str, record: dict) -> dict:
    """One measured record of workload ``name`` predicted again by the current ``model``
    (printed as a table row)."""
    from autotune.candidate import Candidate

    if "candidate_json" in record:
        candidate = Candidate.model_validate(record["candidate_json"])
    else:  # files written before candidate_json was stored: match the label
        by_label = {c.label: c for c in candidates(*WORKLOADS[name][1:])}
        candidate = by_label[record["candidate"]]
    estimate = model.predict(candidate)
    predicted, measured = estimate.tracked_bytes("cpu"), record["measured_bytes"]
    error = (predicted - measured) / measured
    print(
        f"| {candidate.label} | {estimate.phase} | {predicted / 2**20:.1f} | "
        f"{measured / 2**20:.1f} | {100 * error:+.1f}% |"
    )
    return {
        "workload": name,
        "candidate": candidate.label,
        "phase": estimate.phase,
        "predicted_bytes": predicted,
        "measured_bytes": measured,
        "error": error,
    }


def _errors_summary(rows: list[dict]) -> dict:
    """Median and worst |error| and the worst under-prediction of ``rows``, as fractions."""
    errors = [row["error"] for row in rows]
    return {
        "candidates": len(errors),
        "median_abs_error": statistics.median(abs(e) for e in errors),
        "worst_abs_error": max(abs(e) for e in errors),
        "worst_under_prediction": max((-e for e in errors if e < 0), default=0.0),
    }


def _summary(errors: list[float], names: list[str]) -> None:
    absolute = [abs(e) for e in errors]
    under = [-e for e in errors if e < 0]
    # the strictest targets of the families measured
    median_t, worst_t, under_t = (
        min(t)
        for t in zip(*(TARGETS["dit" if n.startswith("dit") else "lm"] for n in names), strict=True)
    )
    print(f"\ncandidates: {len(errors)}")
    print(f"median |error|: {100 * statistics.median(absolute):.2f}%  (target <= {median_t:.0%})")
    print(f"worst |error|: {100 * max(absolute):.2f}%  (target <= {worst_t:.0%})")
    print(f"worst under-prediction: {100 * max(under, default=0):.2f}%  (target <= {under_t:.0%})")


if __name__ == "__main__":
    sys.exit(main())
