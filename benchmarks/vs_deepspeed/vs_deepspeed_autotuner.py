"""autotune against DeepSpeed's own autotuner, side by side, on the same workload and ranks.

Each repeat runs, back to back on 2 CPU ranks (gpt-tiny or, with ``--workload dit-tiny`` or
``dit-cpu``, a DiT; bf16, global batch 16):

1. DeepSpeed's autotuner, ``deepspeed --autotuning tune --num_gpus 2
   benchmarks/vs_deepspeed/ds_autotuner_train.py ...`` (``DS_ACCELERATOR=cpu``,
   ``LOCAL_SIZE=2``, and a stand-in ``pdsh`` that runs its per-experiment clean-up ``pkill``
   on this machine, as there is one node and no pdsh): its default fast mode over every ZeRO
   stage (``"stage": "all"``) and micro-batches up to the global batch
   (``max_train_batch_size``), the same AdamW and threads per rank as autotune's probes.
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
a fraction of the best grid config: the best of DeepSpeed's space, not of autotune's full
space. ``--reference-table TABLE --reference-top K`` widens the reference set
(``benchmarks/vs_deepspeed/vs_deepspeed_reference.py``): the table's K fastest configs (a
table of the same workload, ``benchmarks/search_efficiency/data/table_*.json``) and the
round winners (each autotune study's export and the config its confirmation round ranked
first) are measured in the same interleaved rounds, and each pick is scored against the best
of that set; the tables and the JSON (``score``) name the set.

Reproduce:
    python benchmarks/vs_deepspeed/vs_deepspeed_autotuner.py --repeats 3 --budget-fraction 0.5 \\
        --out benchmarks/vs_deepspeed/data/vs_deepspeed_autotuner.json
    python benchmarks/vs_deepspeed/vs_deepspeed_autotuner.py \\
        --report benchmarks/vs_deepspeed/data/vs_deepspeed_autotuner.json
    python benchmarks/vs_deepspeed/vs_deepspeed_autotuner.py --repeats 5 --budget-fraction 0.5 \\
        --reference-table benchmarks/search_efficiency/data/table_gpt-tiny-amx.json \\
        --reference-top 5 --out /tmp/vs_deepspeed_autotuner_reference.json

With ``--script``, autotune tunes the same unmodified script DeepSpeed's autotuner runs
(``autotune run --script benchmarks/vs_deepspeed/ds_autotuner_train.py -- --workload gpt-tiny
--deepspeed_config CONFIG``, CONFIG being DeepSpeed's config without its ``autotuning``
section): every probe is a launch of the script, as each of DeepSpeed's experiments is.
"per probe" is a probe's mean wall time (autotune: launch to result; DeepSpeed: its wall
over its experiments), "overhead" what of it was not timed steps.

    python benchmarks/vs_deepspeed/vs_deepspeed_autotuner.py --script --repeats 2 \
        --budget-fraction 0.9 --out benchmarks/vs_deepspeed/data/vs_deepspeed_autotuner_script.json

``--workload dit-tiny`` runs the same comparison on a DiT (patch embedding, adaLN
modulation, diffusion loss; ``dit-cpu``, ``benchmarks/workloads.py:dit_cpu``, a larger one)
instead of gpt-tiny:

    python benchmarks/vs_deepspeed/vs_deepspeed_autotuner.py --workload dit-tiny --repeats 5 \
        --budget-fraction 0.5 \
        --out benchmarks/vs_deepspeed/data/vs_deepspeed_autotuner_dit_5repeats.json

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

# run by path, this folder is first on sys.path; the repository root makes the
# benchmarks importable as the package ``benchmarks`` (as the tests import them)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.vs_deepspeed.vs_deepspeed_reference import key as candidate_key
from benchmarks.vs_deepspeed.vs_deepspeed_reference import reference, reference_keys, score
from benchmarks.vs_deepspeed.vs_deepspeed_tuners import (
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

# measures candidates in interleaved rounds: (candidates, rounds, workload) -> per key, its
# label, candidate, samples/s per round and their median (:func:`harness`)
Measure = Callable[[list[dict[str, Any]], int, str], dict[str, dict[str, Any]]]


def harness(
    candidates: list[dict[str, Any]], rounds: int, workload: str = WORKLOAD
) -> dict[str, dict[str, Any]]:
    """Samples/s of each candidate by the same fixed-length probe, interleaved in rounds
    (``workload``: a name of :data:`WORKLOADS`)."""
    from autotune.candidate import Candidate
    from autotune.execution import launch_probes
    from benchmarks.probe_jobs import cpu_probe_jobs

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


def recheck(
    data: dict[str, Any],
    top: int,
    rounds: int,
    widen: dict[str, Any] | None = None,
    measure: Measure = harness,
) -> None:
    """Measure the grid's ``top`` fastest, every tuner's pick and every config of the
    reference beyond the grid (``widen``, :func:`vs_deepspeed_reference.reference`, or the
    run's own) ``rounds`` more times, interleaved (``measure``: :func:`harness`); their
    samples join the run's, so a best that three rounds ranked by chance is ranked again on
    more."""
    if widen is not None:
        data["reference"] = widen
    measured = data["harness"]
    grid_keys = [candidate_key(c) for c in data["grid"]]
    fastest = sorted(grid_keys, key=lambda k: -measured[k]["median"])[:top]
    picks = [run["candidate"] for run in data["runs"]]
    beyond = data.get("reference", {}).get("candidates", [])
    again = [measured[k]["candidate"] for k in fastest] + picks + beyond
    merge_recheck(data, measure(again, rounds, data["workload"]), rounds)
    data["score"] = score(data)


def merge_recheck(data: dict[str, Any], extra: dict[str, dict[str, Any]], rounds: int) -> None:
    """Add a recheck's samples (:func:`harness`'s result) to the run's harness; a config the
    run had not measured joins it with the recheck's samples alone."""
    for name, row in extra.items():
        before = data["harness"].get(name, {**row, "samples_per_s": []})
        rates = before["samples_per_s"] + row["samples_per_s"]
        median = statistics.median(rates) if rates else 0.0
        data["harness"][name] = {**before, "samples_per_s": rates, "median": median}
    data["recheck"] = {"labels": [row["label"] for row in extra.values()], "rounds": rounds}


def measure_runs(
    args: argparse.Namespace, runs: list[dict[str, Any]], measure: Measure = harness
) -> dict[str, Any]:
    """The grid, every pick and the reference set beyond the grid (with
    ``--reference-table``) measured in the same interleaved rounds (``measure``:
    :func:`harness`), as the run's JSON keeps them."""
    grid_candidates = grid()
    widen = widened(args, runs)
    extra = widen["candidates"] if widen else []
    picks = [run["candidate"] for run in runs]
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
        "harness": measure(grid_candidates + picks + extra, args.rounds, args.workload),
    }
    if widen:
        data["reference"] = widen
    data["score"] = score(data)
    return data


def widened(args: argparse.Namespace, runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The reference set beyond the grid that ``--reference-table`` asks for, else None."""
    if args.reference_table is None:
        return None
    return reference(
        args.reference_table,
        args.reference_top,
        runs,
        WORKLOADS[args.workload],
        RANKS,
        GLOBAL_BATCH,
    )


def grid() -> list[dict[str, Any]]:
    from autotune.hardware import detect
    from autotune.space import load_space

    space = load_space(str(COMPARABLE_SPACE)).bind(
        detect(), data_parallel_size=RANKS, global_batch=GLOBAL_BATCH
    )
    return [c.model_dump(mode="json") for c in space.candidates()]


def report(data: dict[str, Any]) -> None:
    """The run's tables: each pick against the best of the reference set, which they name
    (:func:`vs_deepspeed_reference.score`), the grid, and the reference beyond it."""
    measured = data["harness"]
    scored = score(data)
    best = scored["best_samples_per_s"]
    print(
        f"\nworkload {data['workload']}, {RANKS} CPU ranks, bf16 grid of {len(data['grid'])} "
        f"configs; scored against the best of {scored['reference_set']}: {scored['best']} at "
        f"{best:.2f} samples/s ({data['rounds']} interleaved rounds); autotune's budget: "
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
    for run, of_best in zip(data["runs"], scored["of_best"], strict=True):
        row = measured[candidate_key(run["candidate"])]
        per_probe = run.get("probe_wall_s", run["wall_s"] / max(run["probes"], 1))
        overhead = run.get("probe_overhead_s")
        cost = f"{per_probe:.0f} s" + (f" ({overhead:.0f} s)" if overhead is not None else "")
        print(
            f"| {run['repeat']} | {run['tuner']} | {run['wall_s']:.0f} s | {run['probes']} | "
            f"{cost} | {row['label']} | {row['median']:.2f} ({spread(row)}) | {of_best:.3f} |"
        )
    print("\ngrid, by the common harness:\n")
    print_configs(measured, {candidate_key(c) for c in data["grid"]})
    if "reference" in data:
        beyond = reference_keys(data) - {candidate_key(c) for c in data["grid"]}
        print(
            f"\nthe reference beyond the grid ({data['reference']['name']}), by the same harness:\n"
        )
        print_configs(measured, beyond & set(measured))


def print_configs(measured: dict[str, dict[str, Any]], keys: set[str]) -> None:
    print("| config | samples/s median | min..max | rounds |")
    print("|---|---|---|---|")
    for name in sorted(keys, key=lambda k: (-measured[k]["median"], k)):
        row = measured[name]
        print(
            f"| {row['label']} | {row['median']:.2f} | {spread(row)} | "
            f"{len(row['samples_per_s'])} |"
        )


def spread(row: dict[str, Any]) -> str:
    rates = row["samples_per_s"]
    return f"{min(rates):.2f}..{max(rates):.2f}" if rates else "-"


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


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
        "--reference-table",
        type=Path,
        help="a table of the same workload (benchmarks/search_efficiency/data/table_*.json): its "
        "--reference-top fastest configs and the round winners (each autotune study's export "
        "and the config its round ranked first) are measured in the same rounds as the grid, "
        "and each pick is scored against the best of them all, not of the grid alone",
    )
    parser.add_argument(
        "--reference-top",
        type=positive,
        default=5,
        help="how many of the reference table's fastest configs to measure",
    )
    parser.add_argument(
        "--no-full-space", action="store_true", help="skip autotune on its full space"
    )
    parser.add_argument(
        "--script",
        action="store_true",
        help="autotune tunes the same unmodified script DeepSpeed's autotuner runs "
        "(autotune run --script benchmarks/vs_deepspeed/ds_autotuner_train.py -- ...)",
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
    if args.reference_table is not None and args.report:
        parser.error(
            "--reference-table needs measurements: give it with a new run or with --recheck"
        )
    if args.report:
        report(json.loads(args.report.read_text()))
        return 0
    if args.recheck:
        data = json.loads(args.recheck.read_text())
        args.workload = data["workload"]
        recheck(data, args.recheck_top, args.recheck_rounds, widened(args, data["runs"]))
        args.recheck.write_text(json.dumps(data, indent=1))
        report(data)
        return 0
    if shutil.which("deepspeed", path=f"{Path(sys.executable).parent}") is None:
        raise SystemExit("the deepspeed launcher is not installed beside this Python")
    scratch = Path(tempfile.mkdtemp(prefix="autotune-vs-ds-"))
    runs: list[dict[str, Any]] = []
    for repeat in range(1, args.repeats + 1):
        runs += run_repeat(args, scratch, repeat)
    data = measure_runs(args, runs)
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
