"""The GPU check's driver: its command line, each phase under its limit within the whole
budget, and the report (gpu_check.json, gpu_check.md, the logs) written at the end.

Standard library only: it runs before anything is installed, and never touches CUDA
itself (a context here would count as overhead in every probe). What the check does,
phase by phase, is in the package's docstring (benchmarks/gpu_check/__init__.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shlex
import sys
import tarfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._activation_offload_phase import measure_activation_offload
from ._phases import PHASES
from ._run import MARKER, OverTime, Phase, Run, Skip, gpu_memory_used_mib
from .report import exit_code, render_markdown, verdict, verdict_counts
from .settings import (
    DRY_RUN_SETTINGS,
    GPU_SETTINGS,
    MIN_PHASE_S,
    NVME_S,
    Settings,
    own_need,
    plan_lines,
    replan,
)
from .setup_checks import leftover_check

# how long a phase's processes may take to end after its last command: a DataLoader's
# workers, orphaned when a script probe's rank exits, end on their own within their
# watchdog's 5 s (torch.utils.data's _MP_STATUS_CHECK_INTERVAL)
LEFTOVER_GRACE_S = 10.0


def run_phase(run: Run, name: str, body: Callable[[Run, Phase], None]) -> Phase:
    """One phase under its limit (never past the whole budget); what happened, recorded."""
    phase = Phase(name=name)
    run.phases.append(phase)
    limit = phase_limit(run, name)  # the time plan (settings.py)
    phase.timeout_s = max(0.0, min(limit, run.left_s()))
    started = time.monotonic()
    phase.deadline = started + phase.timeout_s
    try:
        if run.facts.get("abort"):
            raise Skip(run.facts["abort"])
        if not limit:
            raise Skip(OFF_REASONS.get(name, OFF_REASON))
        if name in run.settings.if_time_left and limit < own_need(run.settings, name):
            raise Skip(
                f"the plan left {max(limit, 0.0):.0f} s for it, under its "
                f"{own_need(run.settings, name):.0f} s"
            )
        if phase.timeout_s < MIN_PHASE_S:
            raise Skip(f"no time left of the {run.settings.total_s:.0f} s budget")
        body(run, phase)
        failed = [c for c in phase.checks if c["ok"] is False]
        if failed:
            phase.status = "failed"
            phase.reason = "; ".join(f"{c['name']}: {c['detail']}"[:200] for c in failed)
    except Skip as why:
        phase.status, phase.reason = "skipped", str(why)
    except OverTime as why:
        phase.status, phase.reason = "timeout", str(why)
    except Exception as exc:  # noqa: BLE001 - a broken phase is recorded, the rest go on
        phase.status, phase.reason = "failed", f"{type(exc).__name__}: {exc}"[:500]
    phase.seconds = time.monotonic() - started
    if run.cuda:
        phase.gpu_memory_used_mib_after = gpu_memory_used_mib()
    left = run.kill_leftovers(grace_s=LEFTOVER_GRACE_S)
    if left:
        phase.checks.append(leftover_check(left))
        if phase.status == "passed":
            phase.status, phase.reason = "failed", f"processes left running: {len(left)}"
    limit_text = f"{phase.seconds:.1f} s of {phase.timeout_s:.0f} s"
    reason = f": {phase.reason}" if phase.reason else ""
    run.say(f"{name}: {phase.status} ({limit_text}){reason[:300]}")
    return phase


# why a phase planned at 0 does not run (settings.py's time plan)
OFF_REASON = "not in the time plan (settings.py): it does not fit the budget"
OFF_REASONS = {
    "world_size": "needs 2+ devices and --world-size-s, which adds its time to the budget",
    "nvme": "off by default: --nvme runs it, beyond the budget",
}


def phase_limit(run: Run, name: str) -> float:
    """The phase's limit in the time plan; for a phase that runs in the time the plan
    leaves, what is left once the phases after it have their limits and the last phase's
    processes their grace."""
    settings = run.settings
    if settings.timeouts[name] or name not in settings.if_time_left:
        return settings.timeouts[name]
    names = list(settings.timeouts)
    later = sum(settings.timeouts[n] for n in names[names.index(name) + 1 :])
    return run.left_s() - later - LEFTOVER_GRACE_S


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="One prepared check of every CUDA path of autotune on one GPU."
    )
    parser.add_argument("out", type=Path, help="folder for the JSON, the table and the logs")
    parser.add_argument("--dry-run", action="store_true", help="CPU ranks, tiny workload")
    parser.add_argument("--wheels", type=Path, help="wheel folder (prepare_gpu_wheels.py)")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new one in /tmp)")
    parser.add_argument("--total", type=float, help="seconds for the whole check")
    parser.add_argument("--study-budget", type=float, help="most seconds for the GPT-2 study")
    parser.add_argument("--plan", action="store_true", help="print the time plan and exit")
    parser.add_argument("--skip", action="append", default=[], help="phase to skip (repeat)")
    parser.add_argument(
        "--cpu-oom", action="store_true", help="dry run: the oom study on tracked CPU memory too"
    )
    parser.add_argument("--full-memory", action="store_true", help="all 32 memory candidates")
    parser.add_argument(
        "--world-size-s",
        type=float,
        help="seconds for the world-size phase (2+ devices: 2 predicted from 1, then probed), "
        "added to the budget",
    )
    parser.add_argument(
        "--nvme",
        action="store_true",
        help="NVMe offload in a phase of its own, its time added to the budget",
    )
    parser.add_argument(
        "--activation-offload",
        action="store_true",
        help="after the planned phases, outside the plan and the verdict: the workload's "
        "CUDA peak and step time with activation_offload none and cpu at "
        "checkpoint_fraction 0.5 (skipped without CUDA)",
    )
    parser.add_argument(
        "--plan-from",
        type=Path,
        metavar="REPORT",
        help="re-plan each phase's limit from an earlier gpu_check.json's wall times, "
        "within the budget",
    )
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> Settings:
    """The mode's settings with the command line's changes: the plan re-made from an
    earlier report (within the budget), then the phases beyond the budget given time."""
    settings = dataclasses.replace(DRY_RUN_SETTINGS if args.dry_run else GPU_SETTINGS)
    if args.total:
        settings.total_s = args.total
    if args.plan_from:
        report = json.loads(Path(args.plan_from).read_text())
        settings = replan(settings, report["phases"])
    for name, seconds in (("world_size", args.world_size_s), ("nvme", NVME_S[args.dry_run])):
        if seconds and (name != "nvme" or args.nvme):
            settings.timeouts = {**settings.timeouts, name: seconds}
            settings.total_s += seconds
    if args.study_budget:
        settings.study_budget_max_s = args.study_budget
        settings.study_budget_min_s = min(settings.study_budget_min_s, args.study_budget)
    return settings


def make_run(args: argparse.Namespace, settings: Settings) -> Run:
    args.out.mkdir(parents=True, exist_ok=True)
    if args.wheels:
        args.wheels = args.wheels.resolve()  # commands run in the repository's root
    work = args.work or Path(f"/tmp/autotune-gpu-check-{os.getpid()}")
    work.mkdir(parents=True, exist_ok=True)
    console = open(args.out / "gpu_check.log", "w", encoding="utf-8")  # noqa: SIM115
    run = Run(
        args=args, settings=settings, out=args.out.resolve(), work=work.resolve(), console=console
    )
    run.env = {
        **os.environ,
        MARKER: uuid.uuid4().hex,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
    }
    if args.dry_run:
        run.env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks even where a GPU is present
    return run


def write_report(run: Run) -> dict[str, Any]:
    versions = run.facts.get("versions", {})
    report = {
        "kind": "autotune.gpu_check",
        "version": 1,
        "date": datetime.date.today().isoformat(),
        "command": os.environ.get("GPU_CHECK_COMMAND") or shlex.join(sys.argv),
        "dry_run": run.settings.dry_run,
        "device": run.facts.get("device"),
        "versions": versions,
        "budget_s": run.settings.total_s,
        "total_s": time.monotonic() - run.started,
        # the time plan this run ran under (--plan-from re-makes it from the phases' seconds)
        "plan": dict(run.settings.timeouts),
        "plan_from": str(run.args.plan_from or ""),
        "work": str(run.work),
        "facts": {k: v for k, v in run.facts.items() if k != "versions"},
        "phases": [
            {k: v for k, v in dataclasses.asdict(p).items() if k != "deadline"} for p in run.phases
        ],
    }
    report["verdict"] = verdict(report["phases"], expected=list(run.settings.timeouts))
    report["passed"] = report["verdict"]["status"] == "passed"
    (run.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (run.out / "gpu_check.md").write_text(render_markdown(report))
    collect_logs(run.work / "logs", run.out / "phases.log")
    archive_trials(run.work, run.out / "trials.tar.gz")
    return report


def collect_logs(folder: Path, target: Path, keep_bytes: int = 400_000) -> None:
    """Every phase's log in one file, each cut to its last ``keep_bytes``."""
    with open(target, "w", encoding="utf-8") as out:
        for log in sorted(folder.glob("*.log")) if folder.is_dir() else []:
            text = log.read_bytes()[-keep_bytes:].decode(errors="replace")
            out.write(f"\n===== {log.name} =====\n{text}")


# what the phases leave in the work folder that the archive keeps (_memory_phases.py,
# _fsdp2_phase.py, _study_phases.py)
ARCHIVED = (
    "studies.db",
    "trials",
    "memory",
    "memory.json",
    "memory-predicted.json",
    "nvme-probes",
    "nvme.json",
    "nvme-predicted.json",
    "fsdp2",
    "fsdp2.json",
    "fsdp2-predicted.json",
    "fsdp2-export",
    "oom_space.yaml",
)


def archive_trials(work: Path, target: Path, max_file_bytes: int = 2_000_000) -> None:
    """The studies' database, trial folders and the memory probes' reports, small files only
    (no swap or op build files)."""

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if info.isfile() and info.size > max_file_bytes else info

    with tarfile.open(target, "w:gz") as tar:
        for name in ARCHIVED:
            path = work / name
            if path.exists():
                tar.add(path, arcname=name, filter=keep)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = settings_for(args)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"--plan-from {args.plan_from}: not a gpu_check.json report ({exc})", file=sys.stderr)
        return 2
    if args.plan:
        print("\n".join(plan_lines(settings)))
        return 0
    run = make_run(args, settings)
    mode = "CPU dry run" if args.dry_run else "GPU"
    run.say(f"GPU check ({mode}); budget {run.settings.total_s:.0f} s; work in {run.work}")
    for line in plan_lines(run.settings):
        run.say(line)
    try:
        for name, body in PHASES:
            if name in args.skip:
                phase = Phase(name=name, status="skipped", reason="--skip")
                run.phases.append(phase)
                run.say(f"{name}: skipped (--skip)")
                continue
            run_phase(run, name, body)
        if args.activation_offload:
            measure_activation_offload(run)
    finally:
        report = write_report(run)
        run.say(
            f"done in {report['total_s']:.0f} s: "
            + ", ".join(f"{p.name} {p.status}" for p in run.phases)
            + f"; report in {run.out}"
        )
        v = report["verdict"]
        run.say(
            f"verdict: {v['status']}: {verdict_counts(v)} (each with its reason in gpu_check.md)"
        )
        run.console.close()
    # 0 all passed, 1 something failed, 3 nothing failed but something is not verified
    return exit_code(report["verdict"]["status"])


if __name__ == "__main__":
    sys.exit(main())
