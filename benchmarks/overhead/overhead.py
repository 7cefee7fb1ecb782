"""Per-trial overhead of a probe: trial wall time minus the time inside the timed steps.

Runs a real study (``autotune run``) of gpt-tiny on 2 CPU ranks in a scratch folder and
reads the trials back from its SQLite study. For each evaluated trial it reports:

- trial wall: Optuna's datetime_complete - datetime_start (ask -> tell, so it includes
  Ray scheduling and the driver's bookkeeping),
- probe wall: torchrun launch -> exit, as the executor measured it,
- init: rank start -> end of deepspeed.initialize (interpreter, imports, model, engine),
- timed: the sum of the timed optimizer steps,
- overhead = trial wall - timed.

Reproduce:
    python benchmarks/overhead/overhead.py --probes 5 --executor ray          # warm workers
    python benchmarks/overhead/overhead.py --probes 5 --executor ray --cold   # a launch per probe
    python benchmarks/overhead/overhead.py --probes 5 --executor local
    python benchmarks/overhead/overhead.py --probes 8 --cluster 2x1 --sampler grid \
        --space benchmarks/spaces/overhead_fixed.yaml   # spanning: 2 nodes of 1 rank
    (the same with --cluster 1x2: one node of 2 ranks; without --cluster: private Ray)

``--cluster NODESxRANKS`` starts a Ray cluster of that many nodes on this machine (``ray
start``, :class:`autotune.execution.loopback_cluster.LoopbackCluster`), each offering RANKS CPU
ranks,
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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.study import TrialView


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
        from autotune.execution import LoopbackCluster

        nodes, ranks = (int(part) for part in args.cluster.split("x"))
        with LoopbackCluster(nodes, ranks) as cluster:
            return measure(args, cluster.address, cluster.client_env())
    return measure(args, None, {})


def measure(args: argparse.Namespace, address: str | None, env: dict[str, str]) -> int:
    """Run the study, then print each evaluated trial's times and their summary."""
    import os

    import optuna

    from autotune.study import records

    workdir = Path(tempfile.mkdtemp(prefix="autotune-overhead-"))
    command = run_command(args, address)
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
    rows = trial_rows(records.views(study))
    where = f"a {args.cluster} Ray cluster on this machine" if args.cluster else args.executor
    print(
        f"# autotune per-trial overhead: {args.workload}, 2 CPU ranks, --executor "
        f"{where}, {'cold launches' if args.cold else 'warm workers'}, {len(rows)} probes"
    )
    print(f"command: (cd {workdir} && autotune {' '.join(command[3:])})")
    print_summary(rows)
    print(f"whole run (incl. driver start, Ray start, export): {run_wall_s:.1f} s")
    after = os.getloadavg()
    print(f"load average (1/5/15 min) before: {load_before}, after: {after}")
    return 0


def run_command(args: argparse.Namespace, address: str | None) -> list[str]:
    """``autotune run`` of fixed-length probes (2 warm-up, 5 timed steps, no early stop,
    no confirmation), so that runs compare with the baseline."""
    return [
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


@dataclass(frozen=True)
class TrialTimes:
    """One probed trial's times, in seconds."""

    number: int
    label: str
    status: str
    trial_wall_s: float  # Optuna's datetime_complete - datetime_start
    probe_wall_s: float  # torchrun launch -> exit, as the executor measured it
    init_s: float  # rank start -> end of deepspeed.initialize
    timed_s: float  # the sum of the timed optimizer steps
    trial_dir: str

    @property
    def overhead_s(self) -> float:
        return self.trial_wall_s - self.timed_s


def trial_rows(trials: list[TrialView]) -> list[TrialTimes]:
    """The times of every trial that ran a probe of its own (no repeated proposal)."""
    rows = []
    for trial in trials:
        record = trial.record
        if record.duplicate_of is not None or record.probe_wall_s is None:
            continue
        frozen = trial.frozen
        rows.append(
            TrialTimes(
                number=trial.number,
                label=record.label,
                status=record.status,
                trial_wall_s=(frozen.datetime_complete - frozen.datetime_start).total_seconds(),
                probe_wall_s=record.probe_wall_s,
                init_s=record.probe_init_s,
                timed_s=record.probe_timed_s,
                trial_dir=record.trial_dir,
            )
        )
    return rows


def print_summary(rows: list[TrialTimes]) -> None:
    """The table of the trials' times and their medians."""
    print(
        "| trial | candidate | status | trial wall s | probe wall s | init s | timed s | "
        "overhead s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.number} | {r.label} | {r.status} | {r.trial_wall_s:.1f} | "
            f"{r.probe_wall_s:.1f} | {r.init_s:.1f} | {r.timed_s:.2f} | {r.overhead_s:.1f} |"
        )

    def stat(values: list[float]) -> str:
        return (
            f"median {statistics.median(values):.1f} (min {min(values):.1f}, max {max(values):.1f})"
        )

    overheads = [r.overhead_s for r in rows]
    walls = [r.trial_wall_s for r in rows]
    print()
    print(f"trial wall s: {stat(walls)}")
    print(f"timed steps s: {stat([r.timed_s for r in rows])}")
    print(f"overhead s (trial wall - timed): {stat(overheads)}")
    print(f"overhead share of trial wall: {100 * sum(overheads) / sum(walls):.0f}%")
    if len(rows) > 2:  # the first probe starts the warm ranks; the others reuse them
        print(f"overhead s, probes after the first: {stat(overheads[1:])}")
        print(
            "probe wall - timed s, probes after the first: "
            f"{stat([r.probe_wall_s - r.timed_s for r in rows[1:]])}"
        )
        launcher = [r.probe_wall_s - slowest_rank_s(r.trial_dir) for r in rows[1:]]
        print(f"launcher s (probe wall - slowest rank's wall), after the first: {stat(launcher)}")


def slowest_rank_s(trial_dir: str) -> float:
    """The longest rank wall time of a trial (job start to report, in the rank): what the
    probe's wall time holds beyond it is the launcher's (posting the job, noticing the
    reports, collecting them; Ray calls on a cluster)."""
    import json

    walls = [json.loads(p.read_text())["wall_s"] for p in Path(trial_dir).glob("rank-*.json")]
    return max(walls, default=0.0)


if __name__ == "__main__":
    sys.exit(main())
