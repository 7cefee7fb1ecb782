"""Regenerate README's pictures: docs/report.png and docs/live.png.

    .venv/bin/python benchmarks/screenshots/screenshots.py   # a 3-minute study of real probes
    .venv/bin/python benchmarks/screenshots/screenshots.py --budget 5m --out docs

Runs ``autotune run`` on gpt-tiny (2 CPU ranks, a small space with small ZeRO buckets, so
that ZeRO 0-2 all fit under some micro-batches and not under others) inside a 160x45 tmux
terminal, and captures the screen with its colours every second. The live view's picture
is the last capture that shows the confirmation round's standings (else the last one of
the search), turned into SVG by rich and into PNG by headless Chromium. The report's
picture is Chromium's screenshot of the run's ``report.html``, top part.

Needs tmux and Chromium (Debian: ``apt-get install -y tmux chromium``).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPACE = """\
precision: [fp32]
zero_stage: [0, 1, 2]
offload_optimizer: [none]
offload_param: [none]
micro_batch_size: [1, 2, 4, 8]
activation_checkpointing: [false, true]
zero_knobs:
  reduce_bucket_size: [2.0e+6]
  allgather_bucket_size: [2.0e+6]
"""
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars",
]  # fmt: skip


def run_captured(folder: Path, budget: str) -> list[str]:
    """The run in tmux; every capture of the screen, with colours (ANSI)."""
    tmux = ["tmux", "-L", f"screenshots-{uuid.uuid4().hex[:8]}"]
    done = folder / "exit-code"
    args = [
        sys.executable, "-m", "autotune.cli", "run", "--workload", "gpt-tiny", "--gpus", "2",
        "--executor", "local", "--budget", budget, "--space", "small.yaml", "--vram", "40MiB",
        "--warmup-steps", "1", "--timed-steps", "2", "--max-timed-steps", "4", "--seed", "0",
    ]  # fmt: skip
    command = (
        f"cd {shlex.quote(str(folder))} && TERM=xterm-256color {shlex.join(args)}; "
        f"echo $? > {shlex.quote(str(done))}; sleep 600"
    )
    subprocess.run([*tmux, "new-session", "-d", "-s", "run", "-x", "160", "-y", "45", command])
    screens = []
    try:
        while not done.exists():
            capture = [*tmux, "capture-pane", "-p", "-e", "-t", "run"]
            screens.append(subprocess.run(capture, capture_output=True, text=True).stdout)
            time.sleep(1.0)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    if done.read_text().strip() != "0":
        raise SystemExit(f"the run failed; its last screen:\n{screens[-1] if screens else ''}")
    return screens


def pick_live_screen(screens: list[str]) -> str:
    """Mid-run: the last screen of the confirmation round with a probe running, else of the
    search with a probe running, else the last with the panel."""
    with_panel = [s for s in screens if "autotune · study" in s]
    confirming = [s for s in with_panel if "· confirming" in s and "now " in s]
    searching = [s for s in with_panel if "· searching" in s and "now " in s]
    return (confirming or searching or with_panel or screens)[-1]


def shrink(png: Path) -> None:
    """Few colours on these pictures: a 256-colour palette keeps them small in git."""
    from PIL import Image

    Image.open(png).convert("RGB").quantize(colors=256).save(png, optimize=True)


def terminal_png(screen: str, png: Path, chromium: str) -> None:
    """An ANSI screen capture -> SVG (rich) -> PNG (Chromium)."""
    import re

    from rich.console import Console
    from rich.text import Text

    lines = screen.rstrip("\n").splitlines()
    console = Console(record=True, width=160, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(Text.from_ansi("\n".join(lines)), soft_wrap=True)
    svg = console.export_svg(title="autotune run (live view)")
    svg = re.sub(r"@font-face \{[^}]*\}", "", svg)  # no web fonts: a local monospace
    width, height = (float(v) for v in re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg).groups())
    with tempfile.TemporaryDirectory() as scratch:
        page = Path(scratch) / "live.svg"
        page.write_text(svg)
        shoot(chromium, page.as_uri(), png, int(width) + 1, int(height) + 1, scratch)


def shoot(chromium: str, url: str, png: Path, width: int, height: int, scratch: str) -> None:
    profile = Path(scratch) / f"profile-{uuid.uuid4().hex[:6]}"
    subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
         f"--window-size={width},{height}", url],
        capture_output=True, timeout=180, check=True,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="3m", help="the study's budget (default 3m)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the PNGs")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it")
    options = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None or shutil.which("tmux") is None:
        raise SystemExit("needs chromium and tmux (apt-get install -y chromium tmux)")
    folder = options.keep or Path(tempfile.mkdtemp(prefix="autotune-screenshots-"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "small.yaml").write_text(SPACE)
    screens = run_captured(folder, options.budget)
    options.out.mkdir(parents=True, exist_ok=True)
    terminal_png(pick_live_screen(screens), options.out / "live.png", chromium)
    report = folder / "trials" / "gpt-tiny" / "best" / "report.html"
    with tempfile.TemporaryDirectory() as scratch:
        shoot(chromium, report.as_uri(), options.out / "report.png", 1060, 1900, scratch)
    shrink(options.out / "live.png")  # the report's many shades would lose its marks' colours
    print(f"wrote {options.out / 'live.png'} and {options.out / 'report.png'} (study in {folder})")


if __name__ == "__main__":
    main()
