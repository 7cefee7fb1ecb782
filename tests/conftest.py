"""Shared fixtures: one Ray instance per session, the CLI in a subprocess, process checks."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """One local Ray for the whole session (start-up costs ~3 s), with 2 CPU-rank slots."""
    os.environ.setdefault("RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from autotune.executor import CPU_RANK_RESOURCE

    ray.init(
        num_cpus=2,
        resources={CPU_RANK_RESOURCE: 2},
        include_dashboard=False,
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


def run_cli(
    *args: str, cwd: Path, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``autotune ARGS`` as a user types it, in ``cwd``."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


# Every process this test session starts inherits this tag, orphans included: the "no
# probe left" checks look only at probes of this session, not at another study running on
# the same machine (a benchmark, a second checkout's tests).
TEST_TAG = os.environ.setdefault("AUTOTUNE_TEST_TAG", uuid.uuid4().hex)


def probe_processes() -> list[str]:
    """Command lines of live probe processes (torchrun agents and ranks) of this session."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or [])
            if "autotune.probe" not in cmdline:
                continue
            if process.environ().get("AUTOTUNE_TEST_TAG") == TEST_TAG:
                found.append(cmdline)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found
