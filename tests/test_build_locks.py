"""Build locks left by killed processes: torch's JIT loader waits on them forever."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.hardware import (
    STALE_BUILD_LOCK_S,
    STALE_LOCK_OF_BUILT_OP_S,
    detect,
    ensure_deepspeed_ops,
    remove_stale_build_locks,
    torch_extensions_dir,
)


def _lock(folder: Path, age_s: float, built: bool) -> Path:
    folder.mkdir(parents=True)
    if built:
        (folder / "op.so").write_bytes(b"")
    lock = folder / "lock"
    lock.write_text("")
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


def test_a_leftover_lock_of_a_built_op_goes_a_compile_in_progress_stays(tmp_path: Path) -> None:
    leftover = _lock(tmp_path / "built", STALE_LOCK_OF_BUILT_OP_S + 5, built=True)
    fresh = _lock(tmp_path / "built_fresh", 1, built=True)
    compiling = _lock(tmp_path / "compiling", STALE_LOCK_OF_BUILT_OP_S + 5, built=False)
    dead_compile = _lock(tmp_path / "dead_compile", STALE_BUILD_LOCK_S + 5, built=False)
    remove_stale_build_locks(str(tmp_path))
    assert not leftover.exists() and fresh.exists()
    assert compiling.exists() and not dead_compile.exists()


@pytest.mark.slow
def test_loading_ops_gets_past_a_lock_a_killed_rank_left() -> None:
    """The CI hang: a rank SIGKILLed inside torch's loader left ``lock`` in a built op's
    folder moments before the next run; that run's op check must not wait forever."""
    hardware = detect()
    ensure_deepspeed_ops(hardware, cpu_offload=False)  # built (cached) before the lock
    built = sorted(Path(torch_extensions_dir()).glob("*/fused_adam*.so"))
    assert built, "fused_adam was not built"
    lock = built[0].parent / "lock"
    lock.write_text("")
    then = time.time() - (STALE_LOCK_OF_BUILT_OP_S - 8)  # stale in 8 s
    os.utime(lock, (then, then))
    # a fresh process, as the next run is (this one has the op loaded already)
    code = "from autotune.hardware import *; ensure_deepspeed_ops(detect(), cpu_offload=False)"
    started = time.monotonic()
    try:
        subprocess.run([sys.executable, "-c", code], check=True, timeout=90)
    finally:
        if lock.exists():
            lock.unlink()  # never leave the leftover for the rest of the suite
    waited_s = time.monotonic() - started
    assert waited_s > 5, "the loader did not wait on the lock: the test tests nothing"


@pytest.mark.slow
def test_probe_ranks_get_past_a_lock_a_killed_rank_left(tmp_path: Path) -> None:
    """Ranks JIT-load ops in deepspeed.initialize, without the driver's check in front
    (launch_probes): they must not wait on a leftover lock either."""
    from autotune.launch import launch_probe
    from tests.test_probe import make_job

    ensure_deepspeed_ops(detect(), cpu_offload=False)
    built = sorted(Path(torch_extensions_dir()).glob("*/fused_adam*.so"))
    lock = built[0].parent / "lock"
    lock.write_text("")
    then = time.time() - (STALE_LOCK_OF_BUILT_OP_S - 8)
    os.utime(lock, (then, then))
    try:
        result = launch_probe(make_job(tmp_path, timeout_s=120))
    finally:
        if lock.exists():
            lock.unlink()
    assert result.status == "ok", result.error
