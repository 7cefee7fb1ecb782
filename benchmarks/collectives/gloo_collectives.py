"""What gloo's collectives cost per byte on this machine, by message size: the rates the cost
model assumes for CPU ranks (``autotune/run/cost_model.py``, ``_LINK_BYTES_S`` and the
all-gather's).

Two ranks on this host, one thread each (as a 2-rank CPU probe runs), gloo. For each model
size Psi (elements, fp32): an all-reduce of Psi (what ZeRO-0 does to the gradients) and an
all-gather of Psi/2 per rank into one flat tensor (what ZeRO-1/2 do to the updated
parameters, one message per rank up to DeepSpeed's ``allgather_bucket_size``), each timed
warm (one untimed call first, the same buffers reused, as a training loop reuses them),
``--rounds`` rounds interleaved. A rate is in the cost model's units: the elements its
formula counts (all-reduce 2 (d-1)/d Psi, all-gather (d-1)/d Psi) times 4 bytes, per second.

Reproduce (about 2 minutes on 2 idle cores; the default sizes are the published ones)::

    python benchmarks/collectives/gloo_collectives.py --rounds 3 \\
        --out benchmarks/collectives/data/gloo_collectives.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# run by path, this folder is first on sys.path; the repository root makes the
# benchmarks importable as the package ``benchmarks`` (as the tests import them)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SIZES = (
    1_000_000,
    2_000_000,
    4_000_000,
    6_000_000,
    8_000_000,
    10_000_000,
    12_000_000,
    16_000_000,
    32_000_000,
    64_000_000,
    124_000_000,
)


def _rank(rank: int, port: int, sizes: list[int], rounds: int, out: str) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=120))
    seconds: dict[str, dict[str, list[float]]] = {}
    for _ in range(rounds):
        for psi in sizes:
            half = psi // 2
            full, gathered = torch.ones(psi), torch.empty(psi)
            mine = full.narrow(0, rank * half, half)
            calls = {
                "all_reduce": lambda full=full: dist.all_reduce(full),
                "all_gather": lambda gathered=gathered, mine=mine: dist.all_gather_into_tensor(
                    gathered, mine
                ),
            }
            for name, call in calls.items():
                call()  # warm: buffers touched, gloo's pairs connected
                dist.barrier()
                started = time.perf_counter()
                call()
                dist.barrier()
                elapsed = time.perf_counter() - started
                seconds.setdefault(str(psi), {}).setdefault(name, []).append(elapsed)
    if rank == 0:
        Path(out).write_text(json.dumps(seconds))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--port", type=int, default=29611)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import tempfile

    import torch.multiprocessing as mp

    handle, scratch = tempfile.mkstemp(suffix=".json")
    os.close(handle)
    mp.spawn(_rank, args=(args.port, args.sizes, args.rounds, scratch), nprocs=2)
    seconds = json.loads(Path(scratch).read_text())
    os.unlink(scratch)
    rows = _rows(seconds, args.sizes)
    if args.out:
        import torch

        from benchmarks import machine

        report = {
            "command": " ".join(["python", *sys.argv]),
            "date": machine.today(),
            "commit": machine.commit(),
            "machine": {
                "cpu": machine.cpu_name(),
                "flags": machine.cpu_flags(),
                "cores": os.cpu_count(),
                "platform": platform.platform(),
            },
            "torch": torch.__version__,
            "ranks": 2,
            "threads_per_rank": 1,
            "rounds": args.rounds,
            "rows": rows,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def _rows(seconds: dict[str, dict[str, list[float]]], sizes: list[int]) -> list[dict]:
    """Each size's seconds and rates in the cost model's units, printed as a table."""
    rows = []
    print("| Psi (elements) | all-reduce s | model GB/s | all-gather s | model GB/s | ratio |")
    print("|---|---|---|---|---|---|")
    for psi in sizes:
        reduce_s = statistics.median(seconds[str(psi)]["all_reduce"])
        gather_s = statistics.median(seconds[str(psi)]["all_gather"])
        share = 0.5  # (d-1)/d at d = 2
        row = {
            "psi": psi,
            "all_reduce_s": [round(x, 6) for x in seconds[str(psi)]["all_reduce"]],
            "all_gather_s": [round(x, 6) for x in seconds[str(psi)]["all_gather"]],
            "all_reduce_model_bytes_s": 2 * share * psi * 4 / reduce_s,
            "all_gather_model_bytes_s": share * psi * 4 / gather_s,
        }
        rows.append(row)
        print(
            f"| {psi:,} | {reduce_s:.3f} | {row['all_reduce_model_bytes_s'] / 1e9:.2f} "
            f"| {gather_s:.3f} | {row['all_gather_model_bytes_s'] / 1e9:.2f} "
            f"| {row['all_reduce_model_bytes_s'] / row['all_gather_model_bytes_s']:.2f} |"
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
