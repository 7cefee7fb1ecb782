"""Build locks: torch's ``<op>/lock`` holds no pid, so autotune's loaders hold a kernel lock
(flock on ``<op>.autotune-lock``) meanwhile. A lock whose holder is gone is a leftover and
is removed; one whose holder lives stays, however old.

The slow tests pause a real loader inside torch's lock (a test double of torch's FileBaton
that sleeps after taking the lock, as a long build does) and kill it there, as a probe
timeout kills a rank inside ``deepspeed.initialize``. They work on a private copy of the
built ops, so other runs on this machine never wait on them.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.backends.deepspeed._op_locks import LOCK_SUFFIX, op_lock
from tests.support.ops import copy_built_ops

OLD_S = 3600  # an hour: a lock whose holder lives stays, however old

HOLDER = """
import sys, time
from autotune.backends.deepspeed._op_locks import op_lock
with op_lock(sys.argv[1], "fused_adam"):
    open(sys.argv[1] + "/fused_adam/lock", "w").close()  # as torch's loader creates it
    print("holding", flush=True)
    time.sleep(600)
"""

# A real guarded load of fused_adam that stops inside torch's lock.
PAUSED_LOADER = """
import time
from autotune.backends.deepspeed.ops import guard_op_loads
guard_op_loads()
import torch.utils.file_baton as file_baton
take = file_baton.FileBaton.try_acquire
def take_then_pause(self):
    taken = take(self)
    print("holding", taken, flush=True)
    time.sleep(600)
    return taken
file_baton.FileBaton.try_acquire = take_then_pause
from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder("FusedAdamBuilder").load(verbose=False)
"""

NEXT_RUN = """
from autotune.hardware import detect
from autotune.backends.deepspeed.ops import ensure_deepspeed_ops
from autotune.cli._render import line
report = ensure_deepspeed_ops(detect(), offload_targets=set(), emit=lambda e: print(line(e)))
print("built:", report.built, flush=True)
"""


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def _start(code: str, root: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root), "DS_ACCELERATOR": "cpu"}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _until_holding(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("holding"):
            assert line.split()[1:] in ([], ["True"]), line
            return
    raise AssertionError(f"the holder exited with {process.wait()} before holding the lock")


def _clear_unheld_locks(root: Path) -> list[str]:
    """Remove each op's ``lock`` under ``root`` whose ``<op>.autotune-lock`` no live process
    holds, as :func:`autotune.backends.deepspeed._op_locks.op_lock` does for its own op; the ops
    cleared."""
    cleared = []
    for op_dir in sorted(path for path in root.iterdir() if (path / "lock").exists()):
        fd = os.open(root / (op_dir.name + LOCK_SUFFIX), os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            (op_dir / "lock").unlink()
            cleared.append(op_dir.name)
        except BlockingIOError:
            pass  # a live process holds it
        finally:
            os.close(fd)
    return cleared


def _kill(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()


def test_a_lock_without_a_live_holder_goes_one_with_a_live_holder_stays(tmp_path: Path) -> None:
    root = tmp_path / "ext"
    for op in ("fused_adam", "cpu_adam"):
        (root / op).mkdir(parents=True)
    leftover = root / "cpu_adam" / "lock"
    leftover.write_text("")
    holder = _start(HOLDER, root, str(root))
    try:
        _until_holding(holder)
        live = root / "fused_adam" / "lock"
        _age(live, OLD_S)
        assert _clear_unheld_locks(root) == ["cpu_adam"]
        assert live.exists() and not leftover.exists()
        os.kill(holder.pid, signal.SIGKILL)  # killed while holding: its lock is now a leftover
        holder.wait()
        assert _clear_unheld_locks(root) == ["fused_adam"]
        assert not live.exists()
    finally:
        _kill(holder)


def test_op_lock_clears_a_leftover_and_nests_within_one_process(tmp_path: Path) -> None:
    root = tmp_path / "ext"
    (root / "fused_adam").mkdir(parents=True)
    (root / "fused_adam" / "lock").write_text("")
    with op_lock(str(root), "fused_adam") as cleared, op_lock(str(root), "fused_adam") as inner:
        assert cleared and not inner
        assert not (root / "fused_adam" / "lock").exists()
        assert _clear_unheld_locks(root) == []


@pytest.fixture
def private_ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the built ops (fused_adam and the shared-memory all-reduce) of the default
    folder: up to date where it lies, so loading it compiles nothing."""
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    from autotune.backends.deepspeed.ops import torch_extensions_dir

    default = Path(torch_extensions_dir())
    # In a fresh process: DeepSpeed keeps each op it loaded for the process's life
    # (OpBuilder._loaded_ops), so an op an earlier test loaded from another folder would not
    # be built in the default one here.
    builder = _start(NEXT_RUN, default)
    out, _ = builder.communicate(timeout=1800)
    assert builder.returncode == 0, out[-3000:]
    root = tmp_path / "ext"
    ops = ("deepspeed_shm_comm", "fused_adam")
    assert sorted(copy_built_ops(str(default), str(root), only=ops)) == list(ops)
    return root


@pytest.mark.slow
def test_the_next_run_waits_for_a_live_loader_however_old_and_not_for_a_killed_one(
    private_ops: Path,
) -> None:
    """A loader holds fused_adam's lock; the next run waits for it even though the lock is
    an hour old. The loader is SIGKILLed inside torch's lock: the next run goes on."""
    loader = _start(PAUSED_LOADER, private_ops)
    next_run = None
    try:
        _until_holding(loader)
        lock = private_ops / "fused_adam" / "lock"
        _age(lock, OLD_S)
        next_run = _start(NEXT_RUN, private_ops)
        time.sleep(15)  # imports and ensure up to fused_adam's lock: a few seconds
        assert next_run.poll() is None, next_run.communicate()[0][-3000:]
        assert lock.exists(), "a live loader's lock was removed"
        os.kill(loader.pid, signal.SIGKILL)
        out, _ = next_run.communicate(timeout=120)
        assert next_run.returncode == 0, out[-3000:]
        assert "waiting for another process" in out
        assert "removed the build lock a killed process left in fused_adam/" in out
        assert "built: []" in out, "a copied op was rebuilt"
        assert not lock.exists()
    finally:
        _kill(loader)
        if next_run is not None:
            _kill(next_run)


@pytest.mark.slow
def test_probe_ranks_get_past_a_lock_a_killed_rank_left(
    private_ops: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranks JIT-load ops inside deepspeed.initialize, with no driver's build in front of
    them (launch_probe): a lock left by a rank killed there must not stop them."""
    from autotune.execution.launch import launch_probe
    from tests.support.probe_jobs import make_job

    loader = _start(PAUSED_LOADER, private_ops)
    try:
        _until_holding(loader)
    finally:
        _kill(loader)
    assert (private_ops / "fused_adam" / "lock").exists()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(private_ops))
    result = launch_probe(make_job(tmp_path, timeout_s=180))
    assert result.status == "ok", result.error
    assert not (private_ops / "fused_adam" / "lock").exists()
