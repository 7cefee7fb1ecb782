"""Per-trial overhead of a probe: trial wall time minus the time inside the timed steps.

Runs a real study (``autotune run``) of gpt-tiny on 2 CPU ranks in a scratch folder and
reads the trials back from its SQLite study. For each evaluated trial it reports:

- trial wall: Optuna's datetime_complete - datetime_start (ask -> tell, so it includes
  Ray scheduling and the driver's bookkeeping),
- probe wall: torchrun launch -> exit, as the executor measured it,
- init: rank start -> end of deepspeed.initialize (interpreter, imports, model, engine),
- timed: the sum of the timed optimizer steps,
- overhead = trial wall - timed.

Reproduce:  python benchmarks/overhead.py --probes 5 --executor ray          # warm workers
            python benchmarks/overhead.py --probes 5 --executor ray --cold   # a launch per probe
            python benchmarks/overhead.py --probes 5 --executor local
            python benchmarks/overhead.py --probes 8 --cluster 2x1 --sampler grid \
                --space benchmarks/spaces/overhead_fixed.yaml   # spanning: 2 nodes of 1 rank
            (the same with --cluster 1x2: one node of 2 ranks; without --cluster: private Ray)

``--cluster NODESxRANKS`` starts a Ray cluster of that many nodes on this machine (``ray
start``, :class:`autotune.loopback_cluster.LoopbackCluster`), each offering RANKS CPU ranks,
and runs the study on it with ``--ray-address``: with 2x1 every probe spans both nodes, with
1x2 it runs on one node through the same cluster path.

Each probe runs exactly 2 warm-up and 5 timed steps (adaptive length, early stop and the
confirmation round are switched off), so that runs compare with the baseline.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--executor", choices=["ray", "local"], default="ray")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workload", default="gpt-tiny")
    parser.add_argument("--space", default="default")
    parser.add_argument("--sampler", default="autotune", help="grid: the space in its order")
    parser.add_argument(
        "--cold", action="store_true", help="--cold-probes: one torchrun launch per probe"
    )
    parser.add_argument(
        "--cluster", help="NODESxRANKS: run on a Ray cluster of this shape on this machine"
    )
    args = parser.parse_args()
    if args.cluster:
        from autotune.loopback_cluster import LoopbackCluster

        nodes, ranks = (int(part) for part in args.cluster.split("x"))
        with LoopbackCluster(nodes, ranks) as cluster:
            return measure(args, cluster.address, cluster.client_env())
    return measure(args, None, {})


def measure(args: argparse.Namespace, address: str | None, env: dict[str, str]) -> int:
    import os

    import optuna

    workdir = Path(tempfile.mkdtemp(prefix="autotune-overhead-"))
    command = [
        sys.executable,
        "-m",
        "autotune.cli",
        "run",
        "--workload",
        args.workload,
        "--space",
        str(Path(args.space).resolve()) if Path(args.space).is_file() else args.space,
        "--gpus",
        "2",
        "--budget",
        "30m",
        "--seed",
        str(args.seed),
        "--max-trials",
        str(args.probes),
        "--executor",
        args.executor,
        "--sampler",
        args.sampler,
        "--warmup-steps",
        "2",
        "--max-timed-steps",
        "5",
        "--timed-steps",
        "5",
        "--no-early-stop",
        "--no-confirm",
        *(["--cold-probes"] if args.cold else []),
        *(["--ray-address", address] if address else []),
    ]
    load_before = os.getloadavg()
    started = time.monotonic()
    run = subprocess.run(
        command, cwd=workdir, capture_output=True, text=True, env={**os.environ, **env}
    )
    run_wall_s = time.monotonic() - started
    if run.returncode != 0:
        print(run.stdout, run.stderr, sep="\n")
        return run.returncode
    study = optuna.load_study(
        study_name=args.workload, storage=f"sqlite:///{workdir}/trials/autotune.db"
    )
    rows = []
    for trial in study.get_trials():
        attrs = trial.user_attrs
        if "duplicate_of" in attrs or "probe_wall_s" not in attrs:
            continue
        trial_wall_s = (trial.datetime_complete - trial.datetime_start).total_seconds()
        timed_s = attrs["probe_timed_s"]
        rows.append(
            (
                trial.number,
                attrs["label"],
                attrs["status"],
                trial_wall_s,
                attrs["probe_wall_s"],
                attrs["probe_init_s"],
                timed_s,
                trial_wall_s - timed_s,
            )
        )

    where = f"a {args.cluster} Ray cluster on this machine" if args.cluster else args.executor
    print(
        f"# autotune per-trial overhead: {args.workload}, 2 CPU ranks, --executor "
        f"{where}, {'cold launches' if args.cold else 'warm workers'}, {len(rows)} probes"
    )
    print(f"command: (cd {workdir} && autotune {' '.join(command[3:])})")
    print(
        "| trial | candidate | status | trial wall s | probe wall s | init s | timed s | "
        "overhead s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for number, label, status, wall, probe, init, timed, overhead in rows:
        print(
            f"| {number} | {label} | {status} | {wall:.1f} | {probe:.1f} | {init:.1f} | "
            f"{timed:.2f} | {overhead:.1f} |"
        )

    def stat(values: list[float]) -> str:
        return (
            f"median {statistics.median(values):.1f} (min {min(values):.1f}, max {max(values):.1f})"
        )

    overheads = [r[7] for r in rows]
    timed = [r[6] for r in rows]
    walls = [r[3] for r in rows]
    print()
    print(f"trial wall s: {stat(walls)}")
    print(f"timed steps s: {stat(timed)}")
    print(f"overhead s (trial wall - timed): {stat(overheads)}")
    print(f"overhead share of trial wall: {100 * sum(overheads) / sum(walls):.0f}%")
    if len(rows) > 2:  # the first probe starts the warm ranks; the others reuse them
        print(f"overhead s, probes after the first: {stat(overheads[1:])}")
        print(
            f"probe wall - timed s, probes after the first: {stat([r[4] - r[6] for r in rows[1:]])}"
        )
        launcher = [r[4] - slowest_rank_s(study, r[0]) for r in rows[1:]]
        print(f"launcher s (probe wall - slowest rank's wall), after the first: {stat(launcher)}")
    print(f"whole run (incl. driver start, Ray start, export): {run_wall_s:.1f} s")
    after = os.getloadavg()
    print(f"load average (1/5/15 min) before: {load_before}, after: {after}")
    return 0


def slowest_rank_s(study: object, number: int) -> float:
    """The longest rank wall time of trial ``number`` (job start to report, in the rank):
    what the probe's wall time holds beyond it is the launcher's (posting the job, noticing
    the reports, collecting them; Ray calls on a cluster)."""
    import json

    folder = Path(study.trials[number].user_attrs["trial_dir"])  # type: ignore[attr-defined]
    walls = [json.loads(p.read_text())["wall_s"] for p in folder.glob("rank-*.json")]
    return max(walls, default=0.0)


if __name__ == "__main__":
    sys.exit(main())
