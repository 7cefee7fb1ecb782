"""The best DeepSpeed and the best FSDP2 configuration of a workload, measured side by side
in one run on 2 CPU ranks.

Every candidate of a space over both backends (``benchmarks/spaces/cpu_backends.yaml`` by
default) is probed with fixed-length probes (3 warm-up, 6 timed steps), all candidates of a
round in one torchrun launch with the order rotated each round, so that drift hits both
backends alike. A configuration's throughput is its median over the rounds (min..max), its
peak the largest rank's tracked peak; the memory model's prediction is printed beside it.

Reproduce:
    python benchmarks/backends_side_by_side/backends_side_by_side.py --workloads gpt-tiny \\
        dit-cpu --rounds 3 --out benchmarks/backends_side_by_side/data/backends_side_by_side.json
    python benchmarks/backends_side_by_side/backends_side_by_side.py \\
        --report benchmarks/backends_side_by_side/data/backends_side_by_side.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

# run by path, this folder is first on sys.path; the repository root makes the
# benchmarks importable as the package ``benchmarks`` (as the tests import them)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

HERE = Path(__file__).resolve().parent
WORKLOADS = {"gpt-tiny": "gpt-tiny", "dit-cpu": f"{HERE.parent / 'workloads.py'}:dit_cpu"}
GLOBAL_BATCH = 16
RANKS = 2


def space_candidates(space: Path) -> list[Any]:
    from autotune.hardware import detect
    from autotune.space import load_space

    bound = load_space(str(space)).bind(
        detect(), data_parallel_size=RANKS, global_batch=GLOBAL_BATCH
    )
    return list(bound.candidates())


def measure(workload: str, candidates: list[Any], rounds: int) -> dict[str, dict[str, Any]]:
    """Samples/s of each candidate in ``rounds`` interleaved rounds, its peaks, and the
    memory model's prediction."""
    from autotune.execution import launch_probes
    from autotune.memory import MemoryModel
    from autotune.workloads import get_workload
    from benchmarks.probe_jobs import cpu_probe_jobs

    model = MemoryModel(get_workload(WORKLOADS[workload]))
    rows = {
        c.key: {
            "label": c.label,
            "backend": c.backend,
            "candidate": c.model_dump(mode="json"),
            "samples_per_s": [],
            "peak_bytes": [],
            "predicted_bytes": model.predict(c).tracked_bytes("cpu"),
        }
        for c in candidates
    }
    for index in range(rounds):
        shift = index * max(1, len(candidates) // rounds)
        order = candidates[shift:] + candidates[:shift]
        with tempfile.TemporaryDirectory(prefix="autotune-backends-") as tmp:
            jobs = cpu_probe_jobs(
                WORKLOADS[workload], order, Path(tmp), warmup_steps=3, timed_steps=6,
                timeout_s=300, ranks=RANKS,
            )  # fmt: skip
            for job, result in zip(jobs, launch_probes(jobs), strict=True):
                row = rows[job.spec.candidate.key]
                if result.status == "ok" and result.samples_per_s:
                    row["samples_per_s"].append(result.samples_per_s)
                    row["peak_bytes"].append(max(result.peak_bytes_per_rank or [0]))
                else:
                    row.setdefault("errors", []).append(f"{result.status}: {result.error[:200]}")
        print(f"{workload}: round {index + 1}/{rounds} done", flush=True)
    return rows


def report(data: dict[str, Any]) -> None:
    for workload, rows in data["workloads"].items():
        measured = [r for r in rows.values() if r["samples_per_s"]]
        for row in measured:
            row["median"] = statistics.median(row["samples_per_s"])
        print(f"\n## {workload} ({RANKS} CPU ranks, global batch {GLOBAL_BATCH}, "
              f"{data['rounds']} interleaved rounds)\n")  # fmt: skip
        print("| backend | best configuration | samples/s median (min..max) | peak MiB "
              "(predicted) |")  # fmt: skip
        print("|---|---|---|---|")
        for backend in ("deepspeed", "fsdp2"):
            mine = [r for r in measured if r["backend"] == backend]
            if mine:
                print(_row(backend, max(mine, key=lambda r: r["median"])))
        print("\nevery configuration:\n")
        print("| backend | configuration | samples/s median (min..max) | peak MiB (predicted) |")
        print("|---|---|---|---|")
        for row in sorted(measured, key=lambda r: -r["median"]):
            print(_row(row["backend"], row))
        failed = [r for r in rows.values() if not r["samples_per_s"]]
        for row in failed:
            print(f"- {row['label']}: {'; '.join(row.get('errors', []))}")
        _memory_errors(measured, workload)


def _row(backend: str, row: dict[str, Any]) -> str:
    rates, peak = row["samples_per_s"], max(row["peak_bytes"])
    return (
        f"| {backend} | {row['label']} | {row['median']:.2f} ({min(rates):.2f}..{max(rates):.2f})"
        f" | {peak / 2**20:.1f} ({row['predicted_bytes'] / 2**20:.1f}) |"
    )


def _memory_errors(measured: list[dict[str, Any]], workload: str) -> None:
    for backend in ("deepspeed", "fsdp2"):
        errors = [
            (r["predicted_bytes"] - max(r["peak_bytes"])) / max(r["peak_bytes"])
            for r in measured
            if r["backend"] == backend
        ]
        if errors:
            print(
                f"\n{workload} {backend} memory model: median |error| "
                f"{statistics.median(abs(e) for e in errors):.1%}, worst "
                f"{max(abs(e) for e in errors):.1%}, worst under-prediction "
                f"{max([-e for e in errors if e < 0], default=0.0):.1%}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["gpt-tiny"], choices=WORKLOADS)
    parser.add_argument("--space", type=Path, default=HERE.parent / "spaces" / "cpu_backends.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "data" / "backends_side_by_side.json")
    parser.add_argument("--report", type=Path, help="print the tables of an earlier run")
    args = parser.parse_args()
    if args.report:
        report(json.loads(args.report.read_text()))
        return 0
    candidates = space_candidates(args.space)
    data: dict[str, Any] = {"rounds": args.rounds, "space": args.space.name, "workloads": {}}
    for workload in args.workloads:
        data["workloads"][workload] = measure(workload, candidates, args.rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1))
    report(data)
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
