"""What the loss check (``autotune verify``) costs against a study's budget, and what it says
of the configurations a study measured.

For each workload, runs a real study (``autotune run``) on 2 CPU ranks in a scratch folder,
then ``autotune verify --json`` of its best and of up to ``--others`` more feasible trials
(the fastest of each other precision, ZeRO stage and batch split first), and prints one
Markdown table per workload: each verified trial, its reference, the verdict, the largest
relative loss difference against its tolerance, and the check's seconds, the best's as a
share of the budget the study spent.

A workload ``script:W`` is a ``--script`` study of ``benchmarks/vs_deepspeed/ds_autotuner_train.py
--workload W`` (the unmodified script DeepSpeed's autotuner runs) with an fp32 config of its
own, ``SCRIPT_CONFIG``: the check then runs the script itself, one launch per run.

Reproduce:
    python benchmarks/verify_cost/verify_cost.py              # gpt-tiny, dit-tiny, script
    python benchmarks/verify_cost/verify_cost.py --workload gpt-tiny --budget 3m --steps 10
    python benchmarks/verify_cost/verify_cost.py --workload script:gpt-tiny
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

# run by path, this folder is first on sys.path; the repository root makes the
# benchmarks importable as the package ``benchmarks`` (as the tests import them)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.autotune_cli import autotune_cli

HERE = Path(__file__).resolve().parent
# The user's config of a script study: fp32 ZeRO-0, the rank's batch in one micro-batch.
SCRIPT_CONFIG = {
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 8,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-4}},
    "steps_per_print": 1000000,
}
DEFAULT_WORKLOADS = ["gpt-tiny", "dit-tiny", "script:gpt-tiny"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workload",
        action="append",
        help=f"repeatable; script:W for a script study; default {', '.join(DEFAULT_WORKLOADS)}",
    )
    parser.add_argument("--budget", default="2m", help="each study's budget")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps of each check")
    parser.add_argument("--others", type=int, default=4, help="feasible trials besides the best")
    args = parser.parse_args()
    for workload in args.workload or DEFAULT_WORKLOADS:
        with tempfile.TemporaryDirectory(prefix="verify-cost-") as folder:
            rows, spent_s = _study(Path(folder), workload, args)
        print(f"\n### {workload}: study budget {args.budget}, {spent_s:.0f} s spent\n")
        print("| trial | configuration | reference | verdict | largest difference (tolerance) "
              "| check s | share of the study's time |")  # fmt: skip
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for row in rows:
            print(row)
    return 0


def _study(folder: Path, workload: str, args: argparse.Namespace) -> tuple[list[str], float]:
    """Run the study, verify its best and some other feasible trials; table rows."""
    run = ["run", "--gpus", "2", "--budget", args.budget, "--quiet"]
    if workload.startswith("script:"):
        (folder / "ds_config.json").write_text(json.dumps(SCRIPT_CONFIG))
        script = str(HERE.parent / "vs_deepspeed" / "ds_autotuner_train.py")
        run += ["--script", script, "--executor", "local", "--"]
        run += ["--workload", workload.removeprefix("script:")]
        run += ["--deepspeed_config", "ds_config.json"]
    else:
        run += ["--workload", workload]
    autotune_cli(folder, *run)
    status = json.loads(autotune_cli(folder, "status", "--json").stdout)
    spent_s = float(status["budget"]["spent_s"])
    chosen = _chosen_trials(status, args.others)
    rows = []
    for number in chosen:
        check = json.loads(
            autotune_cli(
                folder, "verify", "--trial", str(number), "--steps", str(args.steps), "--json"
            ).stdout
        )
        rows.append(_row(check, status, spent_s))
    return rows, spent_s


def _chosen_trials(status: dict[str, Any], others: int) -> list[int]:
    """The best, then the fastest feasible trial of each other (precision, stage, split)."""
    best = status["best"]["trial"]
    feasible = sorted(
        (t for t in status["trials"] if t["feasible"] and t["number"] != best),
        key=lambda t: -(t["samples_per_s"] or 0.0),
    )
    seen: set[tuple[Any, ...]] = set()
    chosen = [best]
    for trial in feasible:
        c = trial["candidate"]
        kind = (c["precision"], c["zero_stage"], c["micro_batch_size"], c["offload_optimizer"])
        if kind not in seen and len(chosen) <= others:
            seen.add(kind)
            chosen.append(trial["number"])
    return chosen


def _row(check: dict[str, Any], status: dict[str, Any], spent_s: float) -> str:
    verdict = check["verdict"]
    difference = verdict["max_relative_difference"]
    shown = "inf" if difference is None else f"{100 * difference:.2g}%"
    tolerance = f"{100 * verdict['tolerance_at_max']:.2g}%"
    best = check["trial"] == status["best"]["trial"]
    share = f"{100 * check['seconds'] / spent_s:.0f}%" if best and spent_s else ""
    name = f"{check['trial']}{' (best)' if best else ''}"
    return (
        f"| {name} | {check['label']} | {check['reference_label']} | {verdict['text']} | "
        f"{shown} ({tolerance}) | {check['seconds']:.0f} | {share} |"
    )


if __name__ == "__main__":
    raise SystemExit(main())
