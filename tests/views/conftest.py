"""Fixtures for what people look at: a study of real probes run in a terminal (tmux), a
synthetic study with every kind of outcome, headless Chromium, and a dashboard server."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.support.cli import run_cli
from tests.support.processes import TEST_TAG
from tests.views.synthetic import make_study

# fp32 ZeRO 0-1, four micro-batches, checkpointing on or off. Under the 48 MiB limit the
# memory model rules out every ZeRO-1 candidate (its buckets) and ZeRO-0 at micro-batch 8;
# the random sampler proposes them anyway, so they become trials judged without a probe.
# Thirty timed steps make a probe last a few seconds: the search reads a running probe's
# progress once a second, and the live view test looks for it on the screen. Three probes,
# not a share of the budget, end the search, so that however slow the machine the second
# runs while the first's result is shown as the best; no confirmation round.
SPACE = """\
precision: [fp32]
zero_stage: [0, 1]
offload_optimizer: [none]
offload_param: [none]
micro_batch_size: [1, 2, 4, 8]
activation_checkpointing: [false, true]
"""
RUN = [
    "run", "--workload", "gpt-tiny", "--gpus", "2", "--executor", "local", "--budget", "5m",
    "--max-trials", "3", "--no-confirm",
    "--warmup-steps", "1", "--timed-steps", "30", "--max-timed-steps", "30",
    "--space", "small.yaml", "--sampler", "random", "--seed", "0", "--vram", "48MiB",
]  # fmt: skip


@dataclass
class RealStudy:
    """A study of real probes: where it lives and what the terminal showed meanwhile."""

    folder: Path
    returncode: int
    screens: list[str] = field(default_factory=list)  # tmux captures, oldest first
    output: str = ""  # the last screen (tmux) or stdout (no tmux)
    in_tmux: bool = False

    @property
    def storage(self) -> str:
        return f"sqlite:///{self.folder}/trials/autotune.db"

    @property
    def report(self) -> Path:
        return self.folder / "trials" / "gpt-tiny" / "best" / "report.html"


def _tmux(socket_name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["tmux", "-L", socket_name, *args], capture_output=True, text=True, timeout=30
    )


def run_in_tmux(args: list[str], cwd: Path, timeout_s: float = 900) -> RealStudy:
    """``autotune ARGS`` in a 200x50 tmux terminal; the screen is captured four times a
    second."""
    socket_name = f"autotune-test-{uuid.uuid4().hex[:8]}"
    exit_file = cwd / "exit-code"
    command = (
        f"cd {shlex.quote(str(cwd))} && env -u COLUMNS -u LINES AUTOTUNE_TEST_TAG={TEST_TAG} "
        "TERM=xterm-256color "
        f"{shlex.join([sys.executable, '-m', 'autotune.cli', *args])}; "
        f"echo $? > {shlex.quote(str(exit_file))}; sleep 600"
    )
    started = _tmux(socket_name, "new-session", "-d", "-s", "run", "-x", "200", "-y", "50", command)
    assert started.returncode == 0, started.stderr
    screens: list[str] = []
    try:
        deadline = time.monotonic() + timeout_s
        while not exit_file.exists():
            assert time.monotonic() < deadline, "the run did not end:\n" + "\n".join(screens[-1:])
            screens.append(_tmux(socket_name, "capture-pane", "-p", "-t", "run").stdout)
            time.sleep(0.25)
        time.sleep(0.5)
        last = _tmux(socket_name, "capture-pane", "-p", "-t", "run", "-S", "-200").stdout
        screens.append(last)
    finally:
        _tmux(socket_name, "kill-server")
    code = int(exit_file.read_text().strip() or "-1")
    return RealStudy(cwd, code, screens, screens[-1], in_tmux=True)


@pytest.fixture(scope="package")
def real_study(tmp_path_factory: pytest.TempPathFactory) -> RealStudy:
    """One short study of real probes, run in a terminal when tmux is there (the live view
    test reads its screens), else with its output in a pipe."""
    folder = tmp_path_factory.mktemp("real")
    (folder / "small.yaml").write_text(SPACE)
    if shutil.which("tmux"):
        study = run_in_tmux(RUN, folder)
    else:
        result = run_cli(*RUN, cwd=folder)
        study = RealStudy(folder, result.returncode, [], result.stdout + result.stderr)
    assert study.returncode == 0, study.output
    return study


@pytest.fixture
def synthetic(tmp_path: Path) -> str:
    """Storage URL of a study with every kind of outcome (tests/views/synthetic.py)."""
    return make_study(tmp_path)


# -- headless Chromium --------------------------------------------------------------------
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("needs Chromium (Debian's chromium package; .ci/run installs it)")
    return found


def _browser(url: str, *flags: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                *flags,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )


def screenshot(url: str, png: Path, width: int = 1100, height: int = 3200) -> Path:
    result = _browser(url, f"--screenshot={png}", f"--window-size={width},{height}")
    assert png.exists(), result.stderr[-2000:]
    return png


def dump_dom(url: str, wait_ms: int = 0) -> str:
    flags = ["--dump-dom"] + ([f"--virtual-time-budget={wait_ms}"] if wait_ms else [])
    result = _browser(url, *flags)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def pixels_near(png: Path, color: str, tolerance: int = 12) -> int:
    """How many pixels of the screenshot are within ``tolerance`` of ``color`` (#rrggbb)."""
    from PIL import Image

    target = tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))
    image = Image.open(png).convert("RGB")
    return sum(
        count
        for count, rgb in image.getcolors(maxcolors=1 << 24) or []
        if all(abs(a - b) <= tolerance for a, b in zip(rgb, target, strict=True))
    )


# -- the dashboard --------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Dashboard:
    process: subprocess.Popen[str]
    url: str
    first_line: str


def start_dashboard(
    storage: str, cwd: Path, *extra: str, sigint_ignored: bool = False
) -> Dashboard:
    """``autotune dashboard`` in a subprocess, once it answers over HTTP; with
    ``sigint_ignored`` started as a shell's background job is (SIGINT ignored)."""
    port = free_port()

    def ignore_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    process = subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", "dashboard", "--storage", storage,
         "--port", str(port), *extra],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "250"},
        preexec_fn=ignore_sigint if sigint_ignored else None,
    )  # fmt: skip
    assert process.stdout is not None
    first = process.stdout.readline()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            requests.get(f"{url}/api/studies", timeout=5).raise_for_status()
            break
        except requests.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise AssertionError(f"dashboard did not start: {first}") from None
            time.sleep(0.3)
    return Dashboard(process, url, first)


@pytest.fixture
def dashboards() -> Iterator[list[Dashboard]]:
    started: list[Dashboard] = []
    yield started
    for dashboard in started:
        if dashboard.process.poll() is None:
            dashboard.process.terminate()
            dashboard.process.wait(timeout=30)
