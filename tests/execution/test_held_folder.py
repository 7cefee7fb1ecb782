"""Scratch folders of warm workers and rank actors: a folder whose holder was SIGKILLed is
removed by the next holder; a live holder's folder, and a folder that is no held folder,
are left alone (real processes, real locks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from autotune.execution._held_folder import LOCK_NAME, HeldFolder, sweep_abandoned

PREFIX = "autotune-test-held-"

HOLDER = """
import sys, time
from autotune.execution._held_folder import HeldFolder
folder = HeldFolder(sys.argv[1], root=sys.argv[2])
print(folder.path, flush=True)
time.sleep(600)
"""


def _holder(root: Path) -> tuple[subprocess.Popen[str], Path]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, PREFIX, str(root)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    return process, Path(process.stdout.readline().strip())


def test_a_killed_holders_folder_is_swept_and_a_live_ones_is_kept(tmp_path: Path) -> None:
    live, live_folder = _holder(tmp_path)
    killed, killed_folder = _holder(tmp_path)
    try:
        (killed_folder / "torchrun.log").write_text("a probe's log\n")
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(timeout=30)
        assert sweep_abandoned(PREFIX, str(tmp_path)) == [killed_folder]
        assert not killed_folder.exists()
        assert (live_folder / LOCK_NAME).is_file()
    finally:
        live.kill()
        live.wait(timeout=30)
    # a new holder sweeps on its way in
    folder = HeldFolder(PREFIX, root=str(tmp_path))
    assert not live_folder.exists()
    assert [p.name for p in tmp_path.iterdir()] == [folder.path.name]
    folder.remove()
    assert not folder.path.exists()


def test_a_folder_without_its_lock_file_is_left_alone(tmp_path: Path) -> None:
    other = tmp_path / f"{PREFIX}not-held"
    other.mkdir()
    (other / "file").write_text("x")
    stale = time.time() - 7 * 86400
    os.utime(other, (stale, stale))
    assert sweep_abandoned(PREFIX, str(tmp_path)) == []
    assert (other / "file").is_file()


def test_a_folder_held_in_this_process_is_kept(tmp_path: Path) -> None:
    folder = HeldFolder(PREFIX, root=str(tmp_path))
    try:
        # flock is per open file: another open of the lock file in this process is refused too
        assert sweep_abandoned(PREFIX, str(tmp_path)) == []
        assert folder.path.is_dir()
    finally:
        folder.remove()
