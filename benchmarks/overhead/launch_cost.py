"""CPU and wall time of one probe launch: ranks forked after their imports against torchrun.

Launches the same gpt-tiny probe (2 CPU ranks, fp32 ZeRO-2, micro-batch 4 x 2, one warm-up
and three timed steps) alternately through autotune's launch of CPU ranks
(``autotune.probe.fork_ranks``: the ranks forked from a launcher that has imported their code)
and through the torchrun launch every rank used before (``autotune.probe.loopback_run``: each
rank a program of its own that imports torch, DeepSpeed and transformers), and prints
each launch's wall time and CPU (the launch's whole process tree: ``RUSAGE_CHILDREN``).
DeepSpeed's ops must be built (``autotune build-ops``).

Reproduce: ``python benchmarks/overhead/launch_cost.py --rounds 3`` (about 1 min on 2 cores).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

# run by path, this folder is first on sys.path; the repository root makes the
# benchmarks importable as the package ``benchmarks`` (as the tests import them)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autotune.candidate import Candidate
from autotune.execution import launch
from benchmarks.probe_jobs import cpu_probe_jobs

FORKED_COMMAND = launch.probe_command  # autotune's launch of CPU ranks
CANDIDATE = Candidate(
    precision="fp32",
    zero_stage=2,
    micro_batch_size=4,
    gradient_accumulation_steps=2,
    data_parallel_size=2,
)


def torchrun_command(job: launch.ProbeJob, probe_args: list[str]) -> list[str]:
    """The launch of ``autotune.probe`` under torchrun, as GPU probes are launched."""
    return launch.torchrun_command(job, "autotune.probe.rank", probe_args)


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="Launches of each kind.")
    args = parser.parse_args()
    seen: dict[str, list[tuple[float, float]]] = {"forked": [], "torchrun": []}
    for _ in range(args.rounds):
        for kind in seen:  # interleaved: the machine's drift falls on both alike
            launch.probe_command = FORKED_COMMAND if kind == "forked" else torchrun_command
            root = Path(tempfile.mkdtemp(prefix="launch-cost-"))
            [job] = cpu_probe_jobs(
                "gpt-tiny", [CANDIDATE], root, warmup_steps=1, timed_steps=3, timeout_s=300
            )
            cpu_s, started = children_cpu_s(), time.perf_counter()
            result = launch.launch_probe(job)
            wall_s, cpu_s = time.perf_counter() - started, children_cpu_s() - cpu_s
            if result.status != "ok":
                sys.exit(f"{kind} launch failed: {result.error}")
            seen[kind].append((wall_s, cpu_s))
            print(f"{kind:8s} wall {wall_s:5.1f} s  cpu {cpu_s:5.1f} core-s", flush=True)
    for kind, runs in seen.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(
            f"{kind:8s} median wall {statistics.median(walls):.1f} s "
            f"({min(walls):.1f}-{max(walls):.1f}), median cpu {statistics.median(cpus):.1f} "
            f"core-s ({min(cpus):.1f}-{max(cpus):.1f}), {len(runs)} launches"
        )


if __name__ == "__main__":
    main()
