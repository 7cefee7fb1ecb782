"""Measurements behind the activation dial's design (issue 58), each printed and written as
JSON with its command, machine and commit:

- ``order``: which blocks a share recomputes. The peaks of one forward and backward with
  the first k of n blocks recomputed against the last k, traced on fake tensors (the
  memory model's own trace, ``autotune.memory.activations.trace_once``), for GPT-2 (seq
  1024, where the loss's logits lead the peak) and DiT-S/2 (256 tokens, where the blocks do).
- ``selective-cost``: what a selective recomputation costs. One process's forward and
  backward (1 thread) with every block recomputed in full, selectively, or none,
  interleaved over rounds; the selective step's extra time as a share of the full one's.
- ``under-limit``: what the dial buys under a memory limit. On 2 CPU ranks, the fastest
  candidate that recomputes nothing (screened in interleaved rounds) sets the limit at 0.9x
  its measured peak; of the candidates predicted to fit it (every ZeRO stage and
  micro-batch asked, each recomputation at its smallest share that fits), those whose
  measured peak fits are screened, and the best all-or-nothing (no recomputation, or every
  block in full) and the best partial or selective are re-measured interleaved with the
  unlimited fastest. Their ratio is the dial's gain; the unlimited fastest over the best
  all-or-nothing bounds it (no recomputation can beat recomputing nothing).
- ``studies``: what a short study picks under that limit. ``--repeats`` studies of
  ``--budget`` (``autotune run --vram LIMIT --space benchmarks/spaces/activation_dial.yaml``,
  as a user types it), each export re-measured interleaved with the under-limit run's best
  all-or-nothing and best partial or selective; a pick is good at >= 0.97 of the fastest.

Reproduce (about 2 and 4 minutes on 2 idle cores):
    python benchmarks/activation_dial/activation_dial.py order \
        --out benchmarks/activation_dial/data/activation_dial_order.json
    python benchmarks/activation_dial/activation_dial.py selective-cost \
        --out benchmarks/activation_dial/data/activation_dial_selective_cost.json
    python benchmarks/activation_dial/activation_dial.py under-limit --workload dit-s-2 \
        --global-batch 16 --stages 0 --micro-batches 2 4 8 --screen-rounds 1 --top 1 \
        --out benchmarks/activation_dial/data/activation_dial_under_limit_dit-s-2.json
        # ZeRO-0 only: on CPU ranks ZeRO-1 and 3 peak at 3x ZeRO-0's (DeepSpeed's CPU
        # buffers), so under a limit set by ZeRO-0 none of theirs fits
    python benchmarks/activation_dial/activation_dial.py studies --repeats 5 --budget 2m \
        --limit-from benchmarks/activation_dial/data/activation_dial_under_limit_dit-s-2.json \
        --out benchmarks/activation_dial/data/activation_dial_studies_dit-s-2.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# run by path, this folder is first on sys.path; the repository root makes the
# benchmarks importable as the package ``benchmarks`` (as the tests import them)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MiB = 2**20
# (workload, blocks, micro-batch): shapes where the blocks or the loss lead the peak
ORDER_CASES = (("gpt2", 6, 2), ("dit-s-2", 6, 4))
COST_CASES = (("gpt2", 4, 2), ("dit-s-2", 4, 8))


def _machine() -> dict[str, Any]:
    from benchmarks import machine

    return {"cpu": machine.cpu_name(), "commit": machine.commit(), "date": machine.today()}


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


FRACTIONS = (0.25, 0.5, 0.75, 1.0)
LIMIT_SHARE = 0.9


def _probe_rounds(workload: str, candidates: list[Any], rounds: int) -> dict[str, dict[str, Any]]:
    """Samples/s and measured peak of each candidate, by fixed-length probes on 2 CPU ranks
    (all of a round in one launch), the order rotated between rounds."""
    import tempfile

    from autotune.execution import launch_probes
    from benchmarks.probe_jobs import cpu_probe_jobs
    from benchmarks.vs_deepspeed.vs_deepspeed_tuners import RANKS, threads_per_rank

    rows = {
        c.key: {"label": c.label, "candidate": c, "samples_per_s": [], "peak_bytes": 0}
        for c in candidates
    }
    for index in range(rounds):
        shift = (index * max(1, len(candidates) // rounds)) % max(1, len(candidates))
        order = candidates[shift:] + candidates[:shift]
        with tempfile.TemporaryDirectory(prefix="autotune-dial-") as tmp:
            jobs = cpu_probe_jobs(
                workload,
                order,
                Path(tmp),
                warmup_steps=2,
                timed_steps=4,
                timeout_s=600,
                ranks=RANKS,
                threads_per_rank=threads_per_rank(),
            )
            for job, result in zip(jobs, launch_probes(jobs), strict=True):
                row = rows[job.spec.candidate.key]
                if result.status == "ok" and result.samples_per_s:
                    row["samples_per_s"].append(result.samples_per_s)
                    peak = max(result.peak_bytes_per_rank or [0])
                    row["peak_bytes"] = max(row["peak_bytes"], peak)
                else:
                    row["error"] = f"{result.status}: {result.error[:80]}"
        print(f"{len(candidates)} candidates: round {index + 1}/{rounds}", flush=True)
    for row in rows.values():
        rates = row["samples_per_s"]
        row["median"] = statistics.median(rates) if rates else 0.0
    return rows


def _all_or_nothing(candidate: Any) -> bool:
    return candidate.checkpoint_fraction in (0, 1) and candidate.checkpoint_policy == "full"


def _candidate(
    stage: int, micro_batch: int, global_batch: int, fraction: float = 0.0, policy: str = "full"
) -> Any:
    """An fp32 candidate of 2 data-parallel ranks recomputing ``fraction`` with ``policy``."""
    from autotune.candidate import Candidate

    return Candidate(
        precision="fp32",
        zero_stage=stage,
        micro_batch_size=micro_batch,
        gradient_accumulation_steps=global_batch // (2 * micro_batch),
        data_parallel_size=2,
        checkpoint_fraction=fraction,
        checkpoint_policy=policy,
    )


def _dial_candidates(
    workload_ref: str,
    global_batch: int,
    stages: list[int],
    micro_batches: list[int],
    limit_bytes: int,
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The candidates predicted to fit ``limit_bytes``: per stage and micro-batch, no
    recomputation where it fits, else every block in full, and each policy's smallest
    share that fits (a larger share only adds recomputation); with every prediction."""
    from autotune.memory import MemoryModel
    from autotune.workloads import get_workload

    model = MemoryModel(get_workload(workload_ref))
    predictions: list[dict[str, Any]] = []

    def fits(candidate: Any) -> bool:
        predicted = model.predict(candidate).tracked_bytes("cpu")
        predictions.append({"label": candidate.label, "predicted_MiB": round(predicted / MiB, 1)})
        return predicted <= limit_bytes

    chosen: list[Any] = []
    for stage in stages:
        for micro_batch in micro_batches:
            if fits(none := _candidate(stage, micro_batch, global_batch)):
                chosen.append(none)
                continue
            for policy in ("full", "selective"):
                shares = (
                    _candidate(stage, micro_batch, global_batch, f, policy) for f in FRACTIONS
                )
                smallest = next((candidate for candidate in shares if fits(candidate)), None)
                if smallest is not None:
                    chosen.append(smallest)
            if (full := _candidate(stage, micro_batch, global_batch, 1.0)) not in chosen and fits(
                full
            ):
                chosen.append(full)
    return chosen, predictions


def under_limit(args: argparse.Namespace) -> dict[str, Any]:
    """The best partial or selective candidate against the best all-or-nothing one under a
    limit of 0.9x the peak of the fastest that recomputes nothing."""
    none = [
        _candidate(stage, micro_batch, args.global_batch)
        for stage in args.stages
        for micro_batch in args.micro_batches
    ]
    screened = _probe_rounds(args.workload, none, args.screen_rounds)
    fastest = max(screened.values(), key=lambda row: row["median"])
    limit = int(LIMIT_SHARE * fastest["peak_bytes"])
    print(
        f"fastest recomputing nothing: {fastest['label']} {fastest['median']:.2f}/s, peak "
        f"{fastest['peak_bytes'] / MiB:.0f} MiB; limit {limit / MiB:.0f} MiB",
        flush=True,
    )
    chosen, predictions = _dial_candidates(
        args.workload, args.global_batch, args.stages, args.micro_batches, limit
    )
    if not chosen:
        print(f"no candidate is predicted to fit {limit / MiB:.0f} MiB", flush=True)
        return {"workload": args.workload, "limit_MiB": round(limit / MiB, 1), "fits": []}
    dial = _probe_rounds(args.workload, chosen, args.screen_rounds)
    fitting = [row for row in dial.values() if row["median"] and row["peak_bytes"] <= limit]
    groups = {
        "all_or_nothing": [r for r in fitting if _all_or_nothing(r["candidate"])],
        "partial_or_selective": [r for r in fitting if not _all_or_nothing(r["candidate"])],
    }
    finalists = [fastest["candidate"]]
    for rows in groups.values():
        rows.sort(key=lambda row: row["median"], reverse=True)
        finalists += [row["candidate"] for row in rows[: args.top]]
    final = _probe_rounds(args.workload, finalists, args.rounds)
    best = {
        name: max((final[r["candidate"].key] for r in rows[: args.top]), key=lambda r: r["median"])
        for name, rows in groups.items()
        if rows
    }
    unlimited = final[fastest["candidate"].key]
    result: dict[str, Any] = {
        "workload": args.workload,
        "global_batch": args.global_batch,
        "limit_MiB": round(limit / MiB, 1),
        "screen_none": [public(row) for row in screened.values()],
        "predicted": predictions,
        "screen_dial": [public(row) for row in dial.values()],
        "final": [public(row) for row in final.values()],
        "unlimited_fastest": public(unlimited),
        "best": {name: public(row) for name, row in best.items()},
    }
    if len(best) == 2:
        result.update(_gain(best["all_or_nothing"], best["partial_or_selective"], unlimited))
    return result


def public(row: dict[str, Any]) -> dict[str, Any]:
    """A measured row as the data file keeps it."""
    return {
        "label": row["label"],
        "candidate": row["candidate"].model_dump(mode="json"),
        "samples_per_s": [round(rate, 3) for rate in row["samples_per_s"]],
        "median": round(row["median"], 3),
        "peak_MiB": round(row["peak_bytes"] / MiB, 1),
        **({"error": row["error"]} if "error" in row else {}),
    }


def _gain(aon: dict[str, Any], partial: dict[str, Any], unlimited: dict[str, Any]) -> dict:
    """The dial's gain (best partial or selective over best all-or-nothing, medians and per
    round) and its bound (the unlimited fastest over the best all-or-nothing), printed."""
    result: dict[str, Any] = {}
    result["dial_gain"] = round(partial["median"] / aon["median"], 3)
    result["bound"] = round(unlimited["median"] / aon["median"], 3)
    ratios = [p / a for p, a in zip(partial["samples_per_s"], aon["samples_per_s"], strict=False)]
    result["dial_gain_per_round"] = [round(r, 3) for r in ratios]
    print(
        f"best all-or-nothing {aon['label']} {aon['median']:.2f}/s; best partial or "
        f"selective {partial['label']} {partial['median']:.2f}/s: gain "
        f"{result['dial_gain']:.3f} (per round {min(ratios):.2f}..{max(ratios):.2f}); "
        f"bound (unlimited fastest / all-or-nothing) {result['bound']:.3f}",
        flush=True,
    )
    return result


SPACE = Path(__file__).resolve().parents[1] / "spaces" / "activation_dial.yaml"


def _study(run: list[str], storage: str, name: str) -> dict[str, Any]:
    """One study ``name`` of ``autotune run`` with ``run``'s flags: its export and stop."""
    from benchmarks.autotune_cli import autotune_cli

    started = time.monotonic()
    done = autotune_cli(Path.cwd(), "run", *run, "--study", name)
    status = json.loads(
        autotune_cli(Path.cwd(), "status", "--storage", storage, "--study", name, "--json").stdout
    )
    best = status.get("best") or {}
    trial = next((t for t in status["trials"] if t["number"] == best.get("trial")), None)
    lines = (done.stdout + done.stderr).splitlines()
    record = {
        "study": name,
        "wall_s": round(time.monotonic() - started, 1),
        "export": best.get("label"),
        "candidate": trial["candidate"] if trial else None,
        "trials": len(status["trials"]),
        "stopped": next((x.strip() for x in lines if "search stopped:" in x), None),
    }
    print(json.dumps(record), flush=True)
    return record


def studies(args: argparse.Namespace) -> dict[str, Any]:
    """``--repeats`` studies of ``--budget`` under an under-limit run's limit, as a user
    types them, each export then re-measured interleaved with that run's best
    all-or-nothing and best partial or selective candidates."""
    import tempfile

    from autotune.candidate import Candidate

    limit = json.loads(args.limit_from.read_text())["result"]
    root = Path(tempfile.mkdtemp(prefix="activation_dial_studies_"))
    storage = f"sqlite:///{root}/studies.db"
    run = [
        *("--workload", limit["workload"], "--gpus", "2"),
        *("--global-batch", str(limit["global_batch"]), "--vram", f"{limit['limit_MiB']}MiB"),
        *("--space", str(SPACE), "--budget", args.budget),
        *("--storage", storage, "--trials-dir", str(root / "trials")),
    ]
    exports = [_study(run, storage, f"live-{repeat + 1}") for repeat in range(args.repeats)]
    references = [limit["best"][name]["candidate"] for name in limit["best"]]
    chosen = {}
    for record in [*references, *(e["candidate"] for e in exports if e["candidate"])]:
        candidate = Candidate.model_validate(record)
        chosen.setdefault(candidate.key, candidate)
    rows = _probe_rounds(limit["workload"], list(chosen.values()), args.rounds)
    top = max(row["median"] for row in rows.values())
    for record in exports:
        if record["candidate"]:
            row = rows[Candidate.model_validate(record["candidate"]).key]
            record["score"] = round(row["median"] / top, 3)
            record["peak_MiB"] = round(row["peak_bytes"] / MiB, 1)
    return {
        "limit_from": args.limit_from.name,
        "limit_MiB": limit["limit_MiB"],
        "budget": args.budget,
        "studies": exports,
        "remeasured": [public(row) for row in rows.values()],
        "good_picks": sum(1 for e in exports if e.get("score", 0) >= 0.97),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["order", "selective-cost", "under-limit", "studies"])
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="selective-cost: rounds (7); under-limit: the final interleaved rounds (5)",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workload", default="dit-s-2", help="under-limit: the workload")
    parser.add_argument("--global-batch", type=int, default=16, help="under-limit")
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 1, 3], help="under-limit")
    parser.add_argument(
        "--micro-batches", type=int, nargs="+", default=[2, 4, 8], help="under-limit"
    )
    parser.add_argument(
        "--screen-rounds", type=int, default=2, help="under-limit: rounds of each screen"
    )
    parser.add_argument("--top", type=int, default=2, help="under-limit: finalists of each group")
    parser.add_argument("--limit-from", type=Path, help="studies: an under-limit run's data file")
    parser.add_argument("--repeats", type=int, default=5, help="studies: how many")
    parser.add_argument("--budget", default="2m", help="studies: each one's --budget")
    args = parser.parse_args()
    started = time.monotonic()
    if args.what == "order":
        result: Any = order()
    elif args.what == "selective-cost":
        result = selective_cost(args.rounds or 7)
    elif args.what == "under-limit":
        args.rounds = args.rounds or 5
        result = under_limit(args)
    else:
        args.rounds = args.rounds or 5
        result = studies(args)
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
