"""autotune against DeepSpeed's own autotuner, side by side, on the same workload and ranks.

Each repeat runs, back to back on 2 CPU ranks (gpt-tiny or, with ``--workload dit-tiny`` or
``dit-cpu``, a DiT; bf16, global batch 16):

1. DeepSpeed's autotuner, ``deepspeed --autotuning tune --num_gpus 2
   benchmarks/ds_autotuner_train.py ...`` (``DS_ACCELERATOR=cpu``, ``LOCAL_SIZE=2``, and a
   stand-in ``pdsh`` that runs its per-experiment clean-up ``pkill`` on this machine, as
   there is one node and no pdsh): its default fast mode over every ZeRO stage
   (``"stage": "all"``) and micro-batches up to the global batch (``max_train_batch_size``),
   the same AdamW and threads per rank as autotune's probes.
2. ``autotune run`` on the space DeepSpeed's autotuner can express
   (``benchmarks/spaces/ds_comparable.yaml``: ZeRO 0-3 x micro-batch, bf16) with
   ``--budget`` set to DeepSpeed's wall time (or a fraction of it, ``--budget-fraction``),
   so it never has more time.
3. ``autotune run`` on its full default space (precision, offload, checkpointing too), the
   same budget.

Then one common harness re-measures every pick and the exhaustive grid of the comparable
space: fixed-length probes (3 warm-up, 6 timed steps), all candidates of a round in one
torchrun launch with the order rotated each round, so that drift hits all alike; a config's
throughput is its median over the rounds, with the min..max spread. Each pick is reported as
a fraction of the best grid config.

Reproduce:
    python benchmarks/vs_deepspeed_autotuner.py --repeats 3 --budget-fraction 0.5 \\
        --out benchmarks/data/vs_deepspeed_autotuner.json
    python benchmarks/vs_deepspeed_autotuner.py --report benchmarks/data/vs_deepspeed_autotuner.json

With ``--script``, autotune tunes the same unmodified script DeepSpeed's autotuner runs
(``autotune run --script benchmarks/ds_autotuner_train.py -- --workload gpt-tiny
--deepspeed_config CONFIG``, CONFIG being DeepSpeed's config without its ``autotuning``
section): every probe is a launch of the script, as each of DeepSpeed's experiments is.
"per probe" is a probe's mean wall time (autotune: launch to result; DeepSpeed: its wall
over its experiments), "overhead" what of it was not timed steps.

    python benchmarks/vs_deepspeed_autotuner.py --script --repeats 2 --budget-fraction 0.9 \
        --out benchmarks/data/vs_deepspeed_autotuner_script.json

``--workload dit-tiny`` runs the same comparison on a DiT (patch embedding, adaLN
modulation, diffusion loss; ``dit-cpu``, ``benchmarks/workloads.py:dit_cpu``, a larger one)
instead of gpt-tiny:

    python benchmarks/vs_deepspeed_autotuner.py --workload dit-tiny --repeats 5 \
        --budget-fraction 0.5 --out benchmarks/data/vs_deepspeed_autotuner_dit_5repeats.json

Targets (issues 7, 13 and 38): autotune's pick >= 0.97 of the grid's best in every repeat, in no
more wall time than DeepSpeed's autotuner.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from vs_deepspeed_tuners import (
    COMPARABLE_SPACE,
    GLOBAL_BATCH,
    HERE,
    RANKS,
    WORKLOAD,
    WORKLOADS,
    run_autotune,
    run_deepspeed_autotuner,
    threads_per_rank,
    user_config,
)


def harness(
    candidates: list[dict[str, Any]], rounds: int, workload: str = WORKLOAD
) -> dict[str, dict[str, Any]]:
    """Samples/s of each candidate by the same fixed-length probe, interleaved in rounds
    (``workload``: a name of :data:`WORKLOADS`)."""
    from probe_jobs import cpu_probe_jobs

    from autotune.candidate import Candidate
    from autotune.execution import launch_probes

    parsed = {Candidate.model_validate(c).key: Candidate.model_validate(c) for c in candidates}
    ordered = list(parsed.values())
    rates: dict[str, list[float]] = {key: [] for key in parsed}
    for index in range(rounds):
        shift = index * max(1, len(ordered) // rounds)
        order = ordered[shift:] + ordered[:shift]
        with tempfile.TemporaryDirectory(prefix="autotune-vs-ds-") as tmp:
            jobs = cpu_probe_jobs(
                WORKLOADS.get(workload, workload),
                order,
                Path(tmp),
                warmup_steps=3,
                timed_steps=6,
                timeout_s=300,
                ranks=RANKS,
                threads_per_rank=threads_per_rank(),
            )
            for job, result in zip(jobs, launch_probes(jobs), strict=True):
                if result.status == "ok" and result.samples_per_s:
                    rates[job.spec.candidate.key].append(result.samples_per_s)
        print(f"harness round {index + 1}/{rounds} done", flush=True)
    return {
        key: {
            "label": parsed[key].label,
            "candidate": parsed[key].model_dump(mode="json"),
            "samples_per_s": rates[key],
            "median": statistics.median(rates[key]) if rates[key] else 0.0,
        }
        for key in parsed
    }


def recheck(data: dict[str, Any], top: int, rounds: int) -> None:
    """Measure the grid's ``top`` fastest and every tuner's pick ``rounds`` more times,
    interleaved (:func:`harness`); their samples join the run's, so a best that three rounds
    ranked by chance is ranked again on more."""
    from autotune.candidate import Candidate

    measured = data["harness"]
    grid_keys = [Candidate.model_validate(c).key for c in data["grid"]]
    fastest = sorted(grid_keys, key=lambda k: -measured[k]["median"])[:top]
    picks = [Candidate.model_validate(run["candidate"]).key for run in data["runs"]]
    keys = list(dict.fromkeys(fastest + picks))
    again = harness([measured[k]["candidate"] for k in keys], rounds, data["workload"])
    merge_recheck(data, again, rounds)


def merge_recheck(data: dict[str, Any], extra: dict[str, dict[str, Any]], rounds: int) -> None:
    """Add a recheck's samples (:func:`harness`'s result) to the run's harness."""
    for key, row in extra.items():
        rates = data["harness"][key]["samples_per_s"] + row["samples_per_s"]
        data["harness"][key].update(samples_per_s=rates, median=statistics.median(rates))
    data["recheck"] = {"labels": [row["label"] for row in extra.values()], "rounds": rounds}


def grid() -> list[dict[str, Any]]:
    from autotune.hardware import detect
    from autotune.space import load_space

    space = load_space(str(COMPARABLE_SPACE)).bind(
        detect(), data_parallel_size=RANKS, global_batch=GLOBAL_BATCH
    )
    return [c.model_dump(mode="json") for c in space.candidates()]


def report(data: dict[str, Any]) -> None:
    from autotune.candidate import Candidate

    measured = data["harness"]
    grid_keys = {Candidate.model_validate(c).key for c in data["grid"]}
    best_key = max(grid_keys, key=lambda k: measured[k]["median"])
    best = measured[best_key]["median"]
    print(
        f"\nworkload {data['workload']}, {RANKS} CPU ranks, bf16 grid of {len(grid_keys)} configs; "
        f"best {measured[best_key]['label']} at {best:.2f} samples/s "
        f"({data['rounds']} interleaved rounds); autotune's budget: "
        f"{data.get('budget_fraction', 1.0):g} x DeepSpeed's wall time of the same repeat\n"
    )
    if "recheck" in data:
        print(
            f"rechecked in {data['recheck']['rounds']} more interleaved rounds (their medians "
            f"over all rounds): {', '.join(data['recheck']['labels'])}\n"
        )
    print(
        "| repeat | tuner | wall | probes | per probe (overhead) | pick | samples/s (min..max) "
        "| of best |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for run in data["runs"]:
        key = Candidate.model_validate(run["candidate"]).key
        rates = measured[key]["samples_per_s"]
        spread = f"{min(rates):.2f}..{max(rates):.2f}" if rates else "-"
        per_probe = run.get("probe_wall_s", run["wall_s"] / max(run["probes"], 1))
        overhead = run.get("probe_overhead_s")
        cost = f"{per_probe:.0f} s" + (f" ({overhead:.0f} s)" if overhead is not None else "")
        print(
            f"| {run['repeat']} | {run['tuner']} | {run['wall_s']:.0f} s | {run['probes']} | "
            f"{cost} | {measured[key]['label']} | {measured[key]['median']:.2f} ({spread}) | "
            f"{measured[key]['median'] / best:.3f} |"
        )
    print("\ngrid, by the common harness:\n")
    print("| config | samples/s median | min..max |")
    print("|---|---|---|")
    for key in sorted(grid_keys, key=lambda k: -measured[k]["median"]):
        rates = measured[key]["samples_per_s"]
        spread = f"{min(rates):.2f}..{max(rates):.2f}" if rates else "-"
        print(f"| {measured[key]['label']} | {measured[key]['median']:.2f} | {spread} |")


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default=WORKLOAD,
        help="what both tuners train: gpt-tiny, dit-tiny or dit-cpu "
        "(benchmarks/workloads.py:dit_cpu)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="harness rounds")
    parser.add_argument("--out", type=Path, default=HERE / "data" / "vs_deepspeed_autotuner.json")
    parser.add_argument("--report", type=Path, help="print the tables of an earlier run")
    parser.add_argument(
        "--recheck",
        type=Path,
        help="an earlier run: measure its grid's --recheck-top fastest and every pick "
        "--recheck-rounds more times, write the run back with those samples and report",
    )
    parser.add_argument("--recheck-top", type=int, default=2)
    parser.add_argument("--recheck-rounds", type=int, default=9)
    parser.add_argument(
        "--no-full-space", action="store_true", help="skip autotune on its full space"
    )
    parser.add_argument(
        "--script",
        action="store_true",
        help="autotune tunes the same unmodified script DeepSpeed's autotuner runs "
        "(autotune run --script benchmarks/ds_autotuner_train.py -- ...)",
    )
    parser.add_argument(
        "--budget-fraction",
        type=float,
        default=1.0,
        help="autotune's --budget as a fraction of DeepSpeed's wall time (at most 1)",
    )
    return parser


def main() -> int:
    parser = arguments()
    args = parser.parse_args()
    if args.report:
        report(json.loads(args.report.read_text()))
        return 0
    if args.recheck:
        data = json.loads(args.recheck.read_text())
        recheck(data, args.recheck_top, args.recheck_rounds)
        args.recheck.write_text(json.dumps(data, indent=1))
        report(data)
        return 0
    if shutil.which("deepspeed", path=f"{Path(sys.executable).parent}") is None:
        raise SystemExit("the deepspeed launcher is not installed beside this Python")
    scratch = Path(tempfile.mkdtemp(prefix="autotune-vs-ds-"))
    runs: list[dict[str, Any]] = []
    for repeat in range(1, args.repeats + 1):
        runs += run_repeat(args, scratch, repeat)
    grid_candidates = grid()
    picks = [run["candidate"] for run in runs]
    measured = harness(grid_candidates + picks, args.rounds, args.workload)
    data = {
        "workload": args.workload,
        "ranks": RANKS,
        "global_batch": GLOBAL_BATCH,
        "threads_per_rank": threads_per_rank(),
        "rounds": args.rounds,
        "budget_fraction": min(1.0, args.budget_fraction),
        "script": args.script,
        "runs": runs,
        "grid": grid_candidates,
        "harness": measured,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1))
    report(data)
    print(f"\nwritten to {args.out}; logs in {scratch}")
    return 0


def run_repeat(args: argparse.Namespace, scratch: Path, repeat: int) -> list[dict[str, Any]]:
    """One repeat: DeepSpeed's autotuner, then autotune on each space within its wall time."""
    load = os.getloadavg()[0]  # other work on the machine, for the record
    workload = WORKLOADS[args.workload]
    ds = run_deepspeed_autotuner(scratch / f"r{repeat}-deepspeed", workload)
    runs = [{"repeat": repeat, "load_before": load, **ds}]
    print(
        f"repeat {repeat}: deepspeed {ds['wall_s']:.0f} s, {ds['probes']} experiments, "
        f"pick {ds['candidate']}",
        flush=True,
    )
    spaces = [str(COMPARABLE_SPACE)] + ([] if args.no_full_space else ["default"])
    for space in spaces:
        name = Path(space).stem
        budget_s = ds["wall_s"] * min(1.0, args.budget_fraction)
        script_config = user_config(scratch / f"r{repeat}-deepspeed") if args.script else None
        load = os.getloadavg()[0]
        at = run_autotune(
            scratch / f"r{repeat}-{name}", space, budget_s, seed=repeat,
            script_config=script_config, workload=workload,
        )  # fmt: skip
        runs.append({"repeat": repeat, "load_before": load, **at})
        print(
            f"repeat {repeat}: {at['tuner']} {at['wall_s']:.0f} s, {at['probes']} probes, "
            f"pick {at['candidate']}",
            flush=True,
        )
    return runs


if __name__ == "__main__":
    sys.exit(main())
