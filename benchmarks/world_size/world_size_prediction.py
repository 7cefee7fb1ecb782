"""How well a study's fitted cost model predicts a world size it never probed
(``autotune plan --study S --gpus N``): a study at the smaller world size, a study of the
same space and global batch at the larger, and each configuration both measured compared:
the smaller study's prediction against the larger study's measurement.

Prints one Markdown table (configuration, predicted samples/s, measured, error) and the
median and worst absolute error, beside the in-sample error of the larger study's own fit.

With ``--loopback-nodes 2`` both studies run on a Ray cluster of that many nodes on this
machine (``autotune.execution.loopback_cluster``, ``--small`` ranks each): the larger world
size's probes span nodes, and the prediction is told so (``--gpus-per-node``).

Reproduce:
    python benchmarks/world_size/world_size_prediction.py                   # gpt-tiny, 1 -> 2
    python benchmarks/world_size/world_size_prediction.py --budget 3m --workload dit-tiny
    python benchmarks/world_size/world_size_prediction.py --loopback-nodes 2  # spanning nodes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# run by path, this folder is first on sys.path; the repository root makes the
# benchmarks importable as the package ``benchmarks`` (as the tests import them)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.autotune_cli import autotune_cli

SPACE = """\
precision: [fp32]
zero_stage: [0, 1, 2]
offload_optimizer: [none]
offload_param: [none]
micro_batch_size: [2, 4, 8]
gradient_accumulation_steps: [1, 2, 4]
activation_checkpointing: [false]
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="gpt-tiny")
    parser.add_argument("--budget", default="2m", help="each study's budget")
    parser.add_argument("--small", type=int, default=1, help="world size probed")
    parser.add_argument("--large", type=int, default=2, help="world size predicted")
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument(
        "--loopback-nodes", type=int, default=0, help="run on a Ray cluster of this many nodes"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="world-size-") as scratch, _cluster(args) as cluster:
        folder = Path(scratch)
        (folder / "space.yaml").write_text(SPACE)
        env = cluster.client_env() if cluster is not None else None
        on_cluster = ["--ray-address", cluster.address] if cluster is not None else []
        per_node = ["--gpus-per-node", str(args.small)] if cluster is not None else []
        for ranks in (args.small, args.large):
            autotune_cli(
                folder, "run", "--workload", args.workload, "--gpus", str(ranks),
                "--study", f"w{ranks}", "--space", "space.yaml", "--global-batch",
                str(args.global_batch), "--budget", args.budget, "--no-confirm", "--quiet",
                *on_cluster, env=env,
            )  # fmt: skip
        predicted = _forecast(folder, f"w{args.small}", args.large, per_node)
        in_sample = _forecast(folder, f"w{args.large}", args.large, per_node)
    where = (
        f", on a loopback Ray cluster of {args.loopback_nodes} nodes of {args.small} rank(s)"
        if args.loopback_nodes
        else ""
    )
    print(
        f"\n### {args.workload}: predicted at {args.large} rank(s) from a study at "
        f"{args.small}, against a study at {args.large} (global batch {args.global_batch}, "
        f"--budget {args.budget} each{where})\n"
    )
    print("| configuration | predicted samples/s | measured samples/s | error | in-sample error |")
    print("| --- | --- | --- | --- | --- |")
    errors, own = [], []
    for key, row in in_sample.items():
        measured = row["measured_samples_per_s"]
        if key not in predicted or not measured:
            continue
        guess = predicted[key]["predicted_samples_per_s"]
        error = guess / measured - 1
        errors.append(abs(error))
        own.append(abs(row["measured_error"]))
        print(
            f"| {row['label']} | {guess:.1f} | {measured:.1f} | {100 * error:+.0f}% | "
            f"{100 * row['measured_error']:+.0f}% |"
        )
    if errors:
        print(
            f"\n{len(errors)} configuration(s) measured at both: median absolute error "
            f"{100 * statistics.median(errors):.0f}% (worst {100 * max(errors):.0f}%); the "
            f"larger study's own fit, {100 * statistics.median(own):.0f}% "
            f"(worst {100 * max(own):.0f}%)"
        )
    return 0


@contextlib.contextmanager
def _cluster(args: argparse.Namespace) -> Iterator[Any]:
    """A loopback Ray cluster with ``--loopback-nodes`` nodes of ``--small`` ranks, or None."""
    if not args.loopback_nodes:
        yield None
        return
    from autotune.execution.loopback_cluster import LoopbackCluster

    with LoopbackCluster(nodes=args.loopback_nodes, ranks=args.small) as cluster:
        yield cluster


def _forecast(folder: Path, study: str, gpus: int, extra: list[str]) -> dict[str, Any]:
    """The study's rows at ``gpus`` ranks, by candidate."""
    done = autotune_cli(
        folder, "plan", "--study", study, "--gpus", str(gpus), "--all", "--json", *extra
    )
    rows = json.loads(done.stdout)["rows"]
    return {json.dumps(r["candidate"], sort_keys=True): r for r in rows}


if __name__ == "__main__":
    raise SystemExit(main())
