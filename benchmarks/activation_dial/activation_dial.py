"""Measurements behind the activation dial's design (issue 58), each printed and written as
JSON with its command, machine and commit:

- ``order``: which blocks a share recomputes. The peaks of one forward and backward with
  the first k of n blocks recomputed against the last k, traced on fake tensors (the
  memory model's own trace, ``autotune.memory.activations.trace_once``), for GPT-2 (seq
  1024, where the loss's logits lead the peak) and DiT-S/2 (256 tokens, where the blocks do).
- ``selective-cost``: what a selective recomputation costs. One process's forward and
  backward (1 thread) with every block recomputed in full, selectively, or none,
  interleaved over rounds; the selective step's extra time as a share of the full one's.

Reproduce (about 2 and 4 minutes on 2 idle cores):
    python benchmarks/activation_dial/activation_dial.py order \
        --out benchmarks/activation_dial/data/activation_dial_order.json
    python benchmarks/activation_dial/activation_dial.py selective-cost \
        --out benchmarks/activation_dial/data/activation_dial_selective_cost.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MiB = 2**20
# (workload, blocks, micro-batch): shapes where the blocks or the loss lead the peak
ORDER_CASES = (("gpt2", 6, 2), ("dit-s-2", 6, 4))
COST_CASES = (("gpt2", 4, 2), ("dit-s-2", 4, 8))


def _machine() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {"cpu": cpu, "commit": commit, "date": datetime.date.today().isoformat()}


def order() -> list[dict[str, Any]]:
    """First k against last k of n blocks recomputed: peaks of the traced step."""
    from autotune.memory import activations
    from autotune.workloads import get_workload

    rows = []
    for name, blocks, micro_batch in ORDER_CASES:
        workload = get_workload(name).with_layers(blocks)
        kind = type(workload)
        for recomputed in (1, blocks // 2, blocks - 1):
            first = activations.trace_once(
                workload, micro_batch, "fp32", (recomputed, blocks), "dropped"
            )
            original = kind.checkpoint_blocks
            # the same blocks listed last first: the workload then recomputes the last k
            kind.checkpoint_blocks = lambda self, model, listed=original: list(
                reversed(listed(self, model))
            )
            activations._fake_model.cache_clear()
            try:
                last = activations.trace_once(
                    workload, micro_batch, "fp32", (recomputed, blocks), "dropped"
                )
            finally:
                kind.checkpoint_blocks = original
                activations._fake_model.cache_clear()
            row = {
                "workload": name,
                "blocks": blocks,
                "recomputed": recomputed,
                "micro_batch": micro_batch,
                "first_k_backward_peak_MiB": round(first.backward_peak_bytes / MiB, 1),
                "last_k_backward_peak_MiB": round(last.backward_peak_bytes / MiB, 1),
                "first_k_forward_peak_MiB": round(first.forward_peak_bytes / MiB, 1),
                "last_k_forward_peak_MiB": round(last.forward_peak_bytes / MiB, 1),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def selective_cost(rounds: int) -> dict[str, Any]:
    """Step times (forward and backward) with none, full and selective recomputation."""
    import torch

    from autotune.workloads import get_workload
    from autotune.workloads.checkpointing import apply_checkpointing

    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    for name, blocks, micro_batch in COST_CASES:
        workload = get_workload(name).with_layers(blocks)
        models = {}
        for label, fraction, policy in (
            ("none", 0.0, "full"),
            ("full", 1.0, "full"),
            ("selective", 1.0, "selective"),
        ):
            torch.manual_seed(0)
            model = workload.build_model()
            apply_checkpointing(workload, model, fraction, policy)
            models[label] = model.train()
        batch = workload.make_batch(micro_batch, torch.device("cpu"))
        times: dict[str, list[float]] = {label: [] for label in models}
        for _ in range(rounds):
            for label, model in models.items():  # interleaved
                started = time.perf_counter()
                workload.loss(model, batch).backward()
                times[label].append(time.perf_counter() - started)
                model.zero_grad(set_to_none=True)
        median = {label: statistics.median(values[1:]) for label, values in times.items()}
        share = (median["selective"] - median["none"]) / (median["full"] - median["none"])
        out[name] = {
            "blocks": blocks,
            "micro_batch": micro_batch,
            "median_step_s": median,
            "step_s": times,
            "selective_extra_over_full_extra": share,
        }
        print(name, {k: round(v, 3) for k, v in median.items()}, f"share {share:.3f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["order", "selective-cost"])
    parser.add_argument("--rounds", type=int, default=7, help="selective-cost: rounds")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.monotonic()
    result = order() if args.what == "order" else selective_cost(args.rounds)
    record = {
        "command": " ".join(["python", *sys.argv]),
        "machine": _machine(),
        "wall_s": round(time.monotonic() - started, 1),
        "result": result,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
