"""One prepared check of every CUDA path of autotune on one GPU, in under 8 minutes.

    bash benchmarks/gpu_check.sh OUT_DIR --wheels .gpu-wheels   # one CUDA GPU, offline node
    bash benchmarks/gpu_check.sh OUT_DIR --dry-run              # CPU ranks (CI), no GPU

The phases run in order, each under its own time limit inside the whole budget (``--total``,
480 s on a GPU); the console shows the time each took, and a phase that fails or runs over
is recorded and the rest go on (benchmarks/gpu_check_phases.py):

  install            a venv that sees the node's own torch, the carried wheels
                     (benchmarks/prepare_gpu_wheels.py) and autotune from this tree
  env                versions, device, driver; whether hardware detection holds a context
  ops                DeepSpeed's ops (FusedAdam, CPU Adam, async I/O), built side by side
  memory             the memory model against max_memory_allocated and _reserved over 16
                     candidates (bf16 and fp16 x ZeRO 0-3 x 2 micro-batches x checkpointing)
  precision_offload  fp16 (dynamic loss scale), bf16, optimizer offload to pinned CPU memory
                     and NVMe, from the memory phase's probes
  gpu_tests          pytest -m gpu (tests/test_gpu_paths.py)
  oom                a study under a limit below ZeRO-0's need: oom recorded, the study goes
                     on, larger micro-batches ruled out, the next probe clean
  study              autotune run on GPT-2 124M (probes, confirmation, export); its budget is
                     what the phases before left, up to --study-budget
  train_export       the exported config trains 20 steps unedited, through launch.sh
                     (a dry run: 2 probes on gpt-tiny, no confirmation, 8 steps)
  study_dit          a shorter study on a DiT workload, with the time left

The phases before the study stop short of the last --reserve seconds (180 s on a GPU: the
study's least budget of 60 s, its start and export, and the training), so a slow phase
costs the phases after it before it costs the study; the study's budget is what is left
then, up to 180 s (--study-budget), and the DiT study gets what the training leaves.

OUT_DIR receives gpu_check.json, gpu_check.md (the table for benchmarks/RESULTS.md, with
date and device), gpu_check.log (this console), phases.log (every command and its output)
and trials.tar.gz (the studies and the probes' reports). Standard library only: it runs
before anything is installed, and never touches CUDA itself (a context here would count
as overhead in every probe).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from gpu_check_report import render_markdown  # noqa: E402

MARKER = "AUTOTUNE_GPU_CHECK_RUN"  # in the environment of every process the check starts
BEFORE_STUDY = ("install", "env", "ops", "memory", "precision_offload", "gpu_tests", "oom")


class Skip(Exception):
    """The phase does not apply here; the message says why."""


class OverTime(Exception):
    """A command of the phase ran past the phase's limit (or the whole budget's); ``output``
    holds what it printed until it was stopped."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


@dataclasses.dataclass
class Settings:
    """What a mode (GPU or CPU dry run) checks with."""

    dry_run: bool
    workload: str
    global_batch: int
    memory_micro_batches: tuple[int, int]
    memory_precisions: tuple[str, str]
    oom_precision: str
    oom_budget_s: float  # the out-of-memory study's budget, at most
    study_budget_max_s: float
    study_budget_min_s: float
    study_overhead_s: float  # start, plan, the last probe, export, report beyond the budget
    reserve_s: float  # kept for the study and the training by the phases before them
    min_probes: int
    study_max_trials: int | None  # the study also stops after this many probes
    study_confirms: bool  # the study ends with its confirmation round
    train_steps: int  # optimizer steps of the exported config's training
    timeouts: dict[str, float]
    total_s: float


GPU_SETTINGS = Settings(
    dry_run=False,
    workload="gpt2",
    global_batch=32,
    memory_micro_batches=(4, 16),
    memory_precisions=("bf16", "fp16"),
    oom_precision="bf16",
    oom_budget_s=75,
    study_budget_max_s=180,
    study_budget_min_s=60,
    study_overhead_s=50,
    reserve_s=180,  # the study's least budget and overhead, the training's limit, 10 s
    min_probes=3,
    study_max_trials=None,
    study_confirms=True,
    train_steps=20,
    timeouts={
        "install": 90,
        "env": 45,
        "ops": 180,
        "memory": 150,
        "precision_offload": 5,
        "oom": 120,
        "gpu_tests": 200,
        "train_export": 60,
    },
    total_s=480,
)
# CPU ranks share two slow cores here with other work: limits are bounds, not targets
DRY_RUN_SETTINGS = Settings(
    dry_run=True,
    workload="gpt-tiny",
    global_batch=16,
    memory_micro_batches=(2, 4),
    memory_precisions=("bf16", "fp32"),  # DeepSpeed's CPU accelerator refuses fp16 here
    oom_precision="fp32",
    oom_budget_s=240,
    # room for a first probe beside other busy test files, which takes 20 s or more there
    # (the launcher's imports, the ranks, DeepSpeed's set-up)
    study_budget_max_s=45,
    study_budget_min_s=45,
    study_overhead_s=300,
    reserve_s=0,
    min_probes=1,
    # what a dry run checks (a probe measured, an export that trains) needs no more: each
    # probe and step beyond costs CPU time the rest of the test suite shares (the
    # confirmation round has tests of its own)
    study_max_trials=2,
    study_confirms=False,
    train_steps=8,
    timeouts={
        "install": 300,
        "env": 120,
        "ops": 300,
        "memory": 400,
        "precision_offload": 5,
        "oom": 400,
        "gpu_tests": 120,
        "train_export": 300,
    },
    total_s=1800,
)


@dataclasses.dataclass
class Phase:
    name: str
    status: str = "passed"  # passed | failed | timeout | skipped
    seconds: float = 0.0
    timeout_s: float = 0.0
    reason: str = ""
    summary: str = ""
    checks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    commands: list[str] = dataclasses.field(default_factory=list)
    gpu_memory_used_mib_after: float | None = None
    deadline: float = 0.0


@dataclasses.dataclass
class Run:
    """One check: where it works, what it has learnt, what it ran."""

    args: argparse.Namespace
    settings: Settings
    out: Path
    work: Path
    console: TextIO
    started: float = dataclasses.field(default_factory=time.monotonic)
    python: str = sys.executable  # the venv's, once installed
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    phases: list[Phase] = dataclasses.field(default_factory=list)

    @property
    def deadline(self) -> float:
        return self.started + self.settings.total_s

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, line: str) -> None:
        text = f"[{time.monotonic() - self.started:6.1f} s] {line}"
        print(text, flush=True)
        self.console.write(text + "\n")
        self.console.flush()

    @property
    def cuda(self) -> bool:
        return self.facts.get("accelerator") == "cuda"

    def phase(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.name == name), None)

    # ------------------------------------------------------------ commands

    def run(
        self,
        phase: Phase,
        argv: list[str],
        *,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
        interrupt_first: bool = False,
        stdout_only: bool = False,
    ) -> tuple[int, str]:
        """Run ``argv`` to its end within the phase's limit; (exit code, its output, or its
        stdout alone with ``stdout_only``: a JSON document). Past the limit: SIGINT first
        when ``interrupt_first`` (autotune run exports what it has), then SIGTERM and
        SIGKILL to its process group, and OverTime."""
        json_path = self.work / "logs" / f"stdout-{uuid.uuid4().hex[:8]}.txt"
        process, log, offset = self.start(
            phase, argv, env=env, stdout=json_path if stdout_only else None
        )
        limit = min(timeout_s or float("inf"), phase.deadline - time.monotonic())
        try:
            code = process.wait(timeout=max(limit, 0.1))
        except subprocess.TimeoutExpired:
            self.stop(process, interrupt_first)
            log.close()
            text = read_from(Path(log.name), offset)
            raise OverTime(f"{shlex.join(argv[:4])} ... ran past {limit:.0f} s", text) from None
        finally:
            log.close()
        if stdout_only:
            text = json_path.read_text(errors="replace")
            json_path.unlink()
            return code, text
        return code, read_from(Path(log.name), offset)

    def start(
        self,
        phase: Phase,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        stdout: Path | None = None,
    ) -> tuple[subprocess.Popen[bytes], Any, int]:
        """Start ``argv`` in its own process group, its output appended to the phase's log
        (stdout to ``stdout`` instead, when given)."""
        phase.commands.append(shlex.join(argv))
        logs = self.work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log = open(logs / f"{len(self.phases):02d}-{phase.name}.log", "ab")  # noqa: SIM115
        log.write(f"\n$ {shlex.join(argv)}\n".encode())
        log.flush()
        offset = log.tell()
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(open(stdout, "wb")) if stdout else log
            process = subprocess.Popen(
                argv,
                cwd=REPO,
                env=env or self.env,
                stdout=out,
                stderr=log if stdout else subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return process, log, offset

    def stop(self, process: subprocess.Popen[bytes], interrupt_first: bool) -> None:
        steps = [(signal.SIGINT, 30.0)] if interrupt_first else []
        for sig, wait_s in [*steps, (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        self.kill_leftovers()

    def leftovers(self) -> list[tuple[int, str]]:
        """Processes this check started that still run (they carry its marker)."""
        found = []
        token = f"{MARKER}={self.env.get(MARKER, '')}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if token in (entry / "environ").read_bytes().split(b"\0"):
                    cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                    found.append((int(entry.name), cmd.strip()[:200]))
            except OSError:
                continue
        return found

    def kill_leftovers(self) -> list[str]:
        lines = []
        for pid, cmd in self.leftovers():
            lines.append(f"{pid} {cmd}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return lines


def read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace")


def gpu_memory_used_mib() -> float | None:
    """The device's used memory as nvidia-smi sees it (None without one)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return float(out[0]) if out else None


def run_phase(run: Run, name: str, body: Callable[[Run, Phase], None]) -> Phase:
    """One phase under its limit (never past the whole budget); what happened, recorded."""
    phase = Phase(name=name)
    run.phases.append(phase)
    limit = run.settings.timeouts.get(name, run.left_s())
    left = run.left_s()
    if name in BEFORE_STUDY:  # the study and the training keep their reserve
        left -= run.settings.reserve_s
    phase.timeout_s = max(0.0, min(limit, left))
    started = time.monotonic()
    phase.deadline = started + phase.timeout_s
    try:
        if run.facts.get("abort"):
            raise Skip(run.facts["abort"])
        if phase.timeout_s < 5:
            raise Skip(
                f"no time left of the {run.settings.total_s:.0f} s budget"
                + (" before the study's reserve" if name in BEFORE_STUDY else "")
            )
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
    left = run.kill_leftovers()
    if left:
        phase.checks.append(
            {"name": "no process left running", "ok": False, "detail": "; ".join(left)}
        )
    limit_text = f"{phase.seconds:.1f} s of {phase.timeout_s:.0f} s"
    reason = f": {phase.reason}" if phase.reason else ""
    run.say(f"{name}: {phase.status} ({limit_text}){reason[:300]}")
    return phase


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the JSON, the table and the logs")
    parser.add_argument("--dry-run", action="store_true", help="CPU ranks, tiny workload")
    parser.add_argument("--wheels", type=Path, help="wheel folder (prepare_gpu_wheels.py)")
    parser.add_argument("--work", type=Path, help="scratch folder (default: a new one in /tmp)")
    parser.add_argument("--total", type=float, help="seconds for the whole check")
    parser.add_argument("--study-budget", type=float, help="most seconds for the GPT-2 study")
    parser.add_argument(
        "--reserve", type=float, help="seconds the phases before the study leave it and training"
    )
    parser.add_argument("--skip", action="append", default=[], help="phase to skip (repeat)")
    parser.add_argument(
        "--cpu-oom", action="store_true", help="dry run: the oom study on tracked CPU memory too"
    )
    parser.add_argument("--full-memory", action="store_true", help="all 32 memory candidates")
    return parser.parse_args(argv)


def make_run(args: argparse.Namespace) -> Run:
    settings = dataclasses.replace(DRY_RUN_SETTINGS if args.dry_run else GPU_SETTINGS)
    if args.total:
        settings.total_s = args.total
    if args.reserve is not None:
        settings.reserve_s = args.reserve
    if args.study_budget:
        settings.study_budget_max_s = args.study_budget
        settings.study_budget_min_s = min(settings.study_budget_min_s, args.study_budget)
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
    from gpu_check_phases import archive_trials, collect_logs

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
        "passed": all(p.status in ("passed", "skipped") for p in run.phases),
        "work": str(run.work),
        "facts": {k: v for k, v in run.facts.items() if k != "versions"},
        "phases": [
            {k: v for k, v in dataclasses.asdict(p).items() if k != "deadline"} for p in run.phases
        ],
    }
    (run.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (run.out / "gpu_check.md").write_text(render_markdown(report))
    collect_logs(run.work / "logs", run.out / "phases.log")
    archive_trials(run.work, run.out / "trials.tar.gz")
    return report


def main(argv: list[str] | None = None) -> int:
    from gpu_check_phases import PHASES

    args = parse_args(argv)
    run = make_run(args)
    mode = "CPU dry run" if args.dry_run else "GPU"
    run.say(f"GPU check ({mode}); budget {run.settings.total_s:.0f} s; work in {run.work}")
    try:
        for name, body in PHASES:
            if name in args.skip:
                phase = Phase(name=name, status="skipped", reason="--skip")
                run.phases.append(phase)
                run.say(f"{name}: skipped (--skip)")
                continue
            run_phase(run, name, body)
    finally:
        report = write_report(run)
        run.say(
            f"done in {report['total_s']:.0f} s: "
            + ", ".join(f"{p.name} {p.status}" for p in run.phases)
            + f"; report in {run.out}"
        )
        run.console.close()
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    # run as the module the phases import, not as a second copy named __main__ (whose Skip
    # and OverTime would be other classes than the ones the phases raise)
    import gpu_check

    sys.exit(gpu_check.main())
