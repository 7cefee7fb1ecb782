"""The two tuners of the comparison with DeepSpeed's autotuner, each run as a user runs it.

DeepSpeed's autotuner (``deepspeed --autotuning tune``, fast mode, every ZeRO stage) and
``autotune run`` (on a workload, or with ``--script`` on the same unmodified script
DeepSpeed's autotuner runs), each on the same workload, ranks and global batch; each
returns its pick and what it cost (wall time, probes).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.study import Confirmation, TrialView

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKLOAD = "gpt-tiny"
# Other workloads of the comparison: DiTs (patch embedding, adaLN, diffusion loss). dit-tiny
# is the one whose five repeats fit an afternoon: on these CPUs each of DeepSpeed's
# experiments on dit-cpu takes ~80 s and its model profiling 4 min (RESULTS.md).
WORKLOADS = {
    "gpt-tiny": WORKLOAD,
    "dit-tiny": "dit-tiny",
    "dit-cpu": f"{HERE.parent / 'workloads.py'}:dit_cpu",
}
RANKS = 2
GLOBAL_BATCH = 16
COMPARABLE_SPACE = HERE.parent / "spaces" / "ds_comparable.yaml"

# DeepSpeed's autotuner cleans up after each experiment with
# ``pdsh -f N -w HOSTS pkill -f EXP_NAME`` (autotuning/scheduler.py, clean_up) and exits if
# that fails; on one machine without pdsh this stand-in runs the command here.
PDSH_SHIM = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -f|-w) shift 2 ;;
    *) break ;;
  esac
done
exec "$@"
"""


def threads_per_rank() -> int:
    return max(1, (os.cpu_count() or RANKS) // RANKS)


def run_deepspeed_autotuner(workdir: Path, workload: str = WORKLOAD) -> dict[str, Any]:
    """DeepSpeed's autotuner, fast mode, every ZeRO stage; its pick and what it cost."""
    workdir.mkdir(parents=True)
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    (bin_dir / "pdsh").write_text(PDSH_SHIM)
    (bin_dir / "pdsh").chmod(0o755)
    config_path = deepspeed_config(workdir)
    threads = str(threads_per_rank())
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "LOCAL_SIZE": str(RANKS),
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}",
    }
    env.pop("MLFLOW_RUN_ID", None)
    command = [
        "deepspeed",
        "--autotuning",
        "tune",
        "--num_gpus",
        str(RANKS),
        str(HERE / "ds_autotuner_train.py"),
        "--workload",
        workload,
        "--deepspeed_config",
        str(config_path),
    ]
    started = time.monotonic()
    with open(workdir / "autotuner.log", "wb") as log:
        returncode = subprocess.run(
            command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, check=False
        ).returncode
    wall_s = time.monotonic() - started
    return deepspeed_pick(workdir, returncode, wall_s)


def deepspeed_config(workdir: Path) -> Path:
    """DeepSpeed's config with its ``autotuning`` section: fast mode over every ZeRO stage
    and micro-batches up to the global batch, written to ``workdir``."""
    from autotune.backends.deepspeed import DEFAULT_BASE_CONFIG

    config = {
        **DEFAULT_BASE_CONFIG,
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": "all"},
        "autotuning": {
            "enabled": True,
            "fast": True,
            "metric": "throughput",
            "max_train_batch_size": GLOBAL_BATCH,
            "results_dir": str(workdir / "autotuning_results"),
            "exps_dir": str(workdir / "autotuning_exps"),
            "overwrite": True,
        },
    }
    config_path = workdir / "ds_config.json"
    config_path.write_text(json.dumps(config, indent=2))
    return config_path


def deepspeed_pick(workdir: Path, returncode: int, wall_s: float) -> dict[str, Any]:
    """The optimal config DeepSpeed's autotuner wrote, as a candidate, and its cost."""
    results = workdir / "autotuning_results"
    optimal = results / "ds_config_optimal.json"
    experiments = sorted(p.parent.name for p in results.glob("*/exp.json"))
    if returncode != 0 or not optimal.exists():
        tail = (workdir / "autotuner.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"DeepSpeed's autotuner failed (exit {returncode}):\n{tail}")
    chosen = json.loads(optimal.read_text())
    candidate = {
        "precision": "bf16",
        "zero_stage": int(chosen.get("zero_optimization", {}).get("stage", 0)),
        "micro_batch_size": int(chosen["train_micro_batch_size_per_gpu"]),
        "gradient_accumulation_steps": int(chosen.get("gradient_accumulation_steps", 1)),
        "data_parallel_size": RANKS,
    }
    return {
        "tuner": "deepspeed",
        "wall_s": wall_s,
        "probes": len(experiments),
        "experiments": experiments,
        "candidate": candidate,
    }


def user_config(workdir: Path) -> Path:
    """The config the user's script trains with: DeepSpeed's autotuner's, without its
    ``autotuning`` section (which would make the engine exit after its profiled steps)."""
    config = json.loads((workdir / "ds_config.json").read_text())
    config.pop("autotuning", None)
    path = workdir / "user_ds_config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def run_autotune(
    workdir: Path,
    space: str,
    budget_s: float,
    seed: int,
    script_config: Path | None = None,
    workload: str = WORKLOAD,
) -> dict[str, Any]:
    """``autotune run`` as a user types it (with ``script_config``: on the same unmodified
    script DeepSpeed's autotuner ran, ``--script``); its pick (the exported trial) and cost."""
    workdir.mkdir(parents=True)
    storage = f"sqlite:///{workdir / 'autotune.db'}"
    command = autotune_command(storage, space, budget_s, seed, script_config, workload)
    started = time.monotonic()
    with open(workdir / "autotune.log", "wb") as log:
        returncode = subprocess.run(
            command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, check=False
        ).returncode
    wall_s = time.monotonic() - started
    if returncode != 0:
        tail = (workdir / "autotune.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"autotune run failed (exit {returncode}):\n{tail}")
    mode = "--script" if script_config is not None else "workload"
    return {
        "tuner": f"autotune {mode} ({Path(space).stem})",
        "wall_s": wall_s,
        **autotune_pick(storage, workdir),
    }


def autotune_command(
    storage: str,
    space: str,
    budget_s: float,
    seed: int,
    script_config: Path | None,
    workload: str = WORKLOAD,
) -> list[str]:
    source = ["--workload", workload]
    if script_config is not None:
        source = ["--script", str(HERE / "ds_autotuner_train.py")]
    command = [
        sys.executable,
        "-m",
        "autotune.cli",
        "run",
        *source,
        "--gpus",
        str(RANKS),
        "--global-batch",
        str(GLOBAL_BATCH),
        "--space",
        space,
        "--budget",
        f"{int(budget_s)}s",
        "--seed",
        str(seed),
        "--study",
        "vs-ds",
        "--storage",
        storage,
    ]
    if script_config is not None:  # no Ray: each probe is a launch of the script anyway
        command += ["--executor", "local", "--", "--workload", workload]
        command += ["--deepspeed_config", str(script_config)]
    return command


def autotune_pick(storage: str, workdir: Path) -> dict[str, Any]:
    """The study's exported trial, as a candidate, its probes (confirmation re-probes
    included) with their mean wall time and overhead, and the config its confirmation round
    ranked first (the highest estimate, which a simpler or steadier winner may have beaten;
    None without a round): the comparison's reference set holds it
    (benchmarks/vs_deepspeed/vs_deepspeed_reference.py)."""
    import optuna

    from autotune.study import best, records
    from autotune.study import confirmation as confirm

    study = optuna.load_study(study_name="vs-ds", storage=storage)
    trials = records.views(study)
    decided = best.decide_best(trials, confirm.load(study))
    if decided is None:
        raise SystemExit(f"autotune run found no feasible config; see {workdir}/autotune.log")
    probed = [t.record for t in trials if t.record.probe_wall_s is not None]
    verdict = confirm.load(study)
    reprobes = sum(len(c.samples_per_s) - 1 for c in verdict.contenders) if verdict else 0
    return {
        "probes": len(probed) + reprobes,
        "probe_wall_s": statistics.mean(r.probe_wall_s or 0.0 for r in probed),
        "probe_overhead_s": statistics.mean(
            (r.probe_wall_s or 0.0) - r.probe_timed_s for r in probed
        ),
        "candidate": trials[decided.trial].candidate.model_dump(mode="json"),
        "round_first": round_first(verdict, trials),
    }


def round_first(verdict: Confirmation | None, trials: list[TrialView]) -> dict[str, Any] | None:
    """The candidate of the round's highest estimate, by the goal the round ranked by
    (``verdict``: the study's stored ``Confirmation``; ``trials``: its trials by number)."""
    if verdict is None or not verdict.contenders:
        return None
    goal = verdict.ranking
    first = max(verdict.contenders, key=lambda c: goal.score(c.estimate, c.gpus))
    return trials[first.trial].candidate.model_dump(mode="json")
