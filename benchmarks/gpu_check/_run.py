"""One GPU check run: its phases' records and the commands they run under their limits.

:class:`Run` is what every phase gets: where the check works, what it has learnt, the
environment its commands run in; ``run.run`` runs a command to its end within the phase's
limit (:class:`OverTime` past it), and a phase raises :class:`Skip` where it does not apply.
Standard library only, as the whole check's driver (benchmarks/gpu_check/_driver.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

from .settings import Settings

REPO = Path(__file__).resolve().parents[2]
PROBES = str(REPO / "benchmarks" / "gpu_check" / "probes.py")
MARKER = "AUTOTUNE_GPU_CHECK_RUN"  # in the environment of every process the check starts


class Skip(Exception):
    """The phase does not apply here; the message says why."""


class OverTime(Exception):
    """A command of the phase ran past the phase's limit (or the whole budget's); ``output``
    holds what it printed until it was stopped."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


@dataclasses.dataclass
class Phase:
    name: str
    status: str = "passed"  # passed | failed | timeout | skipped
    seconds: float = 0.0  # the phase's own wall time (what --plan-from re-plans from)
    timeout_s: float = 0.0
    reason: str = ""
    summary: str = ""
    checks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    commands: list[str] = dataclasses.field(default_factory=list)
    # what the phase leaves outside the time plan, each not verified with its reason
    outside_plan: list[dict[str, str]] = dataclasses.field(default_factory=list)
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

    def kill_leftovers(self, grace_s: float = 0.0) -> list[str]:
        """Kill what this check started that still runs after ``grace_s`` (each named)."""
        deadline = time.monotonic() + grace_s
        while self.leftovers() and time.monotonic() < deadline:
            time.sleep(0.5)
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
