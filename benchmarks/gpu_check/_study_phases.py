"""The GPU check's study phases: a study under a limit below need (out of memory), the
GPT-2 study, the exported config's training through its launch.sh, and a DiT study; each
through `autotune run`, `autotune status --json` and `autotune plan --json`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ._run import REPO, Phase, Run, Skip
from .oom_checks import oom_checks, oom_limit
from .report import MiB
from .settings import OOM_AFTER_S
from .study_checks import study_checks, study_summary, train_checks, train_speed_check

TRAIN = str(REPO / "benchmarks" / "gpu_check" / "train.py")
# the study's space on a GPU: the default space's DeepSpeed half, so that its best is a
# DeepSpeed config, which the train_export phase trains (FSDP2 has a phase of its own)
STUDY_SPACE = REPO / "benchmarks" / "spaces" / "gpu_check_study.yaml"
DIT_PREFERRED = ("dit-b-2", "dit-s-2")
# what a phase's time left may fall short of its plan by and still run: the moments between
# one phase's end and the next one's start
PLAN_SLACK_S = 1.0


def cli(run: Run, *args: str) -> list[str]:
    return [run.python, "-m", "autotune.cli", *args]


def storage(run: Run) -> str:
    return f"sqlite:///{run.work / 'studies.db'}"


def status_doc(run: Run, phase: Phase, study: str) -> dict[str, Any]:
    argv = cli(run, "status", "--json", "--study", study, "--storage", storage(run))
    code, out = run.run(phase, argv, stdout_only=True)
    if code:
        raise RuntimeError(f"autotune status failed (exit code {code}): {out[-500:]}")
    return json.loads(out)


def rank_reports(status: dict[str, Any]) -> dict[int, dict[str, Any]]:
    reports = {}
    for trial in status.get("trials", []):
        path = Path(trial.get("trial_dir") or "/nonexistent") / "rank-0.json"
        if path.is_file():
            reports[trial["number"]] = json.loads(path.read_text())
    return reports


OOM_SPACE = """\
# The GPU check's out-of-memory study: ZeRO-0 next to ZeRO-2 with optimizer offload, smallest
# micro-batches first (grid order), under a limit the memory model places between them.
precision: [{precision}]
zero_stage: [0, 2]
offload_optimizer: [none, cpu]
offload_param: [none]
micro_batch_size: [1, 2]
gradient_accumulation_steps: [1, 2]
activation_checkpointing: [true]
"""


def phase_oom(run: Run, phase: Phase) -> None:
    if not run.cuda and not run.args.cpu_oom:
        raise Skip("needs CUDA (the CUDA out-of-memory path; --cpu-oom runs it on CPU ranks)")
    s = run.settings
    space = run.work / "oom_space.yaml"
    space.write_text(OOM_SPACE.format(precision=s.oom_precision))
    common = ["--workload", s.workload, "--gpus", "1", "--global-batch", "2", "--space", str(space)]
    argv = cli(run, "plan", *common, "--vram", "1TiB", "--all", "--json")
    code, out = run.run(phase, argv, stdout_only=True)
    if code:
        raise RuntimeError(f"autotune plan failed (exit code {code}): {out[-500:]}")
    plan = json.loads(out)
    memory = run.phase("memory")
    overheads = [
        r.get("overhead_bytes", 0) for r in (memory.data.get("rows", []) if memory else [])
    ]
    overhead = max(overheads, default=0) or (512 * MiB if run.cuda else 0)
    limit = oom_limit(plan, overhead)
    study = "gpu-check-oom"
    budget = max(20.0, min(s.oom_budget_s, phase.deadline - time.monotonic() - OOM_AFTER_S))
    argv = cli(run, "run", *common, "--vram", str(limit["limit_bytes"]), "--no-prune")
    argv += ["--sampler", "grid", "--no-confirm", "--budget", f"{budget:.0f}s", "--seed", "0"]
    argv += _run_flags(run, study)
    code, out = run.run(phase, argv, interrupt_first=True)
    status = status_doc(run, phase, study)
    leftovers = [f"{pid} {cmd}" for pid, cmd in run.leftovers()]
    phase.checks += oom_checks(
        status,
        plan,
        rank_reports(status),
        accelerator="cuda" if run.cuda else "cpu",
        exit_code=code,
        leftovers=leftovers,
        limit_bytes=limit["limit_bytes"],
        baseline_overhead_bytes=min([o for o in overheads if o], default=None),
    )
    phase.data = {"limit": limit, "study": study_summary(status), "run_tail": out[-1500:]}
    phase.summary = (
        f"limit {limit['limit_bytes'] / MiB:.0f} MiB: {limit['runs_out']} over it, "
        f"{limit['fits']} under"
    )


def _run_flags(run: Run, study: str) -> list[str]:
    return [
        "--executor",
        "local",
        "--quiet",
        "--study",
        study,
        "--storage",
        storage(run),
        "--trials-dir",
        str(run.work / "trials"),
    ]


DRY_RUN_SPACE = """\
# The GPU check's dry-run study: a small space whose probes are quick on two CPU cores (the
# default space's first probe, an offloading ZeRO-1 candidate, takes over a minute there),
# DeepSpeed's as on a GPU (benchmarks/spaces/gpu_check_study.yaml).
backend: [deepspeed]
precision: [fp32]
zero_stage: [0, 1]
offload_optimizer: [none]
offload_param: [none]
micro_batch_size: [8, 16]
activation_checkpointing: [false]
"""


def study_phase(
    run: Run, phase: Phase, workload: str, global_batch: int, budget: float, space: str = ""
) -> None:
    """autotune run on ``workload`` for ``budget`` seconds, then its status and export."""
    study = f"gpu-check-{workload}"
    argv = cli(
        run, "run", "--workload", workload, "--gpus", "1", "--global-batch", str(global_batch)
    )
    argv += ["--space", space] * bool(space)
    argv += ["--budget", f"{budget:.0f}s", "--seed", "0", *_run_flags(run, study)]
    if run.settings.study_max_trials:
        argv += ["--max-trials", str(run.settings.study_max_trials)]
    argv += ["--no-confirm"] * (not run.settings.study_confirms)
    code, out = run.run(phase, argv, interrupt_first=True)
    run.facts.setdefault("studies", {})[phase.name] = {
        "study": study, "workload": workload, "global_batch": global_batch, "space": space
    }  # fmt: skip
    status = status_doc(run, phase, study)
    export = run.work / "trials" / study / "best"
    exported = (export / "ds_config.json").is_file()
    summary = study_summary(status)
    phase.data = {
        "workload": workload,
        "budget_s": budget,
        "study": summary,
        "run_tail": out[-3000:],
    }
    settings = run.settings
    phase.checks += study_checks(
        status, code, exported, min_probes=settings.min_probes, confirm=settings.study_confirms
    )
    best = summary.get("best") or {}
    phase.summary = (
        f"budget {budget:.0f} s; best {best.get('label')} at "
        f"{best.get('samples_per_s') or 0:.1f} samples/s"
    )
    if exported and best:
        trial = next((t for t in status["trials"] if t["number"] == best["trial"]), {})
        run.facts.setdefault("exports", {})[phase.name] = {
            "folder": str(export),
            "workload": workload,
            "checkpointing": bool(trial.get("candidate", {}).get("activation_checkpointing")),
            "samples_per_s": best.get("samples_per_s"),
        }


def phase_study(run: Run, phase: Phase) -> None:
    s = run.settings
    # the training has its own line in the time plan: the study's limit is all its own. The
    # budget comes from the planned limit, not the clock since the phase began, so that a
    # limit planned as exactly the minimum budget plus the overhead is not skipped
    budget = min(s.study_budget_max_s, phase.timeout_s - s.study_overhead_s)
    if budget < s.study_budget_min_s - PLAN_SLACK_S:
        raise Skip(f"{budget:.0f} s left for its budget, under {s.study_budget_min_s:.0f} s")
    phase.deadline = min(phase.deadline, time.monotonic() + budget + s.study_overhead_s)
    phase.timeout_s = budget + s.study_overhead_s
    space = str(STUDY_SPACE)
    if s.dry_run:
        space = str(run.work / "dry_run_space.yaml")
        Path(space).write_text(DRY_RUN_SPACE)
    study_phase(run, phase, s.workload, s.global_batch, budget, space)


def phase_train_export(run: Run, phase: Phase) -> None:
    export = run.facts.get("exports", {}).get("study")
    if not export:
        raise Skip("the study phase exported nothing")
    argv = ["bash", str(Path(export["folder"]) / "launch.sh"), TRAIN]
    argv += ["--workload", export["workload"], "--steps", str(run.settings.train_steps)]
    argv += ["--checkpointing"] * export["checkpointing"]
    # launch.sh runs in the check's environment (its PATH: deepspeed, torchrun), and loads
    # the ops the ops phase built, as the probes did (the same machine code, and nothing
    # compiled again in a fresh folder). On a GPU node its default launcher (deepspeed); in
    # a dry run torchrun, whose --standalone takes a free port where the deepspeed
    # launcher's fixed 29500 may be busy
    launcher = "torchrun" if run.settings.dry_run else "deepspeed"
    env = {**run.env, "LAUNCHER": launcher}
    argv.append("--autotune-ops")
    code, out = run.run(phase, argv, env=env)
    checks, data = train_checks(out, code, run.settings.train_steps)
    phase.checks += checks
    speeds = data.get("samples_per_s"), export.get("samples_per_s")
    phase.checks.append(train_speed_check(*speeds, judged=not run.settings.dry_run))
    phase.data = {**data, "launcher": launcher, "tail": out[-1500:]}
    phase.summary = f"{data.get('global_steps')} steps, {data.get('samples_per_s')} samples/s"


def phase_study_dit(run: Run, phase: Phase) -> None:
    if run.settings.dry_run:
        raise Skip("dry run: the DiT study runs on a GPU only")
    names = run.facts.get("dit_workloads") or []
    if not names:
        raise Skip("no dit-* workload in autotune.workloads")
    workload = next((n for n in DIT_PREFERRED if n in names), names[0])
    budget = min(90.0, phase.timeout_s - run.settings.study_overhead_s)
    if budget < run.settings.study_budget_min_s - PLAN_SLACK_S:
        raise Skip(
            f"{budget:.0f} s left for its budget, under {run.settings.study_budget_min_s:.0f} s"
        )
    study_phase(run, phase, workload, 64, budget)
