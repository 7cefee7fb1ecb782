"""Shared fixtures and hooks: one Ray instance per session, DeepSpeed's ops before the slow
tests, the units of work and their order under pytest-xdist (tests/support/unit_order.py),
GPU tests skipped without a GPU. Helpers the tests import are in tests/support/."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from tests.support.processes import reap_children
from tests.support.unit_order import (
    NVME_OP,
    is_slow,
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_xdist_make_scheduler,
    seeded_ops_marker,
    session_plan,
    waits_for_newcomer,
)

# the ordering plugin's hooks, taken by this conftest
__all__ = [
    "pytest_collection_finish",
    "pytest_collection_modifyitems",
    "pytest_xdist_make_scheduler",
]


@functools.cache
def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_itemcollected(item: pytest.Item) -> None:
    """A test marked ``gpu`` is skipped where no CUDA GPU is (the GPU check runs them)."""
    if "gpu" in item.keywords and not has_cuda():
        item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; none on this machine"))


# DeepSpeed's async I/O op (NVMe offload), the one op README's command 1 does not build and only two
# tests load (many compile units, minutes of CPU; benchmarks/RESULTS.md), is built into the default
# cache in the background from the moment the newcomer's ops are in, beside that run's study (whose
# budget is wall-clock: what the build takes from it costs no time) and the other worker's tests,
# none of which waits for it. At the lowest CPU priority it got almost nothing beside two busy
# workers, and the first test that loaded the op waited minutes for it. The tests that load it
# (marked ``nvme_op``) run late and wait for it through the op's lock; where no newcomer's
# run started it they build it themselves.
_BACKGROUND_BUILD = """
from deepspeed.accelerator import get_accelerator
from autotune.hardware import detect
from autotune.backends.deepspeed.ops import ensure_deepspeed_ops
def only_async_io(name):
    return get_accelerator().create_op_builder(name) if name == "AsyncIOBuilder" else None
report = ensure_deepspeed_ops(detect(), offload_targets={"nvme"}, create_builder=only_async_io)
print("built", report.built, "cached", report.cached, round(report.seconds), "s", flush=True)
"""
_BACKGROUND: list[subprocess.Popen[bytes]] = []
SEED_WAIT_S = 30 * 60  # the newcomer's own timeout


@pytest.fixture
def start_nvme_build(request: pytest.FixtureRequest) -> Callable[[], None]:
    """Starts the async I/O op's build, once, as soon as the newcomer's ops are in the
    default cache, where a slow test after the newcomer's needs the op."""

    def start() -> None:
        if not session_plan(request.config).nvme_later or _BACKGROUND:
            return
        _BACKGROUND.append(
            subprocess.Popen(
                [sys.executable, "-c", _BACKGROUND_BUILD],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # two compiles at a time beside the workers
                env={**os.environ, "OMP_NUM_THREADS": "1", "MAX_JOBS": "2"},
            )
        )

    return start


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the first slow test (bar the newcomer's), build DeepSpeed's ops into the
    default cache, or find them there: tests that launch probes directly must not compile an
    op inside a probe's timeout. Where the newcomer's run is in this session (in this
    process or another xdist worker), its ops are waited for, not built a second time. A
    test marked ``nvme_op`` also needs the async I/O op: built by then in the background, or
    waited for (its lock), or built here."""
    from tests.support.unit_order import NEWCOMER_TEST, unit

    if not is_slow(item) or unit(item.nodeid) == NEWCOMER_TEST:
        return
    targets = {"cpu", "nvme"} if NVME_OP in item.keywords else {"cpu"}
    plan = session_plan(item.config)
    if targets <= plan.ops_ready:
        return
    from autotune.backends.deepspeed.ops import ensure_deepspeed_ops
    from autotune.cli._render import line as rendered
    from autotune.hardware import detect

    reporter = item.config.pluginmanager.get_plugin("terminalreporter")

    def show(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)

    if waits_for_newcomer(item) and not seeded_ops_marker().exists():
        show("waiting for the newcomer's run to build DeepSpeed's ops ...")
        deadline = time.monotonic() + SEED_WAIT_S
        while not seeded_ops_marker().exists() and time.monotonic() < deadline:
            time.sleep(1)
    ensure_deepspeed_ops(detect(), offload_targets=targets, emit=lambda e: show(rendered(e) or ""))
    plan.ops_ready.update(targets)


@pytest.fixture(autouse=True)
def _fast_tests_build_no_ops(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast test runs the tuner with a fake executor: no probe loads a DeepSpeed op, so
    none is built (on a fresh machine that build would compete with the newcomer's)."""
    if request.node.get_closest_marker("slow") is None:
        from autotune.run._tuner import Tuner

        monkeypatch.setattr(Tuner, "_prepare_ops", lambda self: 0.0)


@pytest.fixture(autouse=True)
def _children_are_reaped() -> Iterator[None]:
    reap_children()
    yield
    reap_children()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """One local Ray for the whole session (its start-up is paid once), with 2 CPU-rank slots."""
    import ray

    from autotune.execution._executor import CPU_RANK_RESOURCE, set_ray_environment

    set_ray_environment()  # as a private Ray of autotune's own (workers at this priority)
    ray.init(
        num_cpus=2,
        resources={CPU_RANK_RESOURCE: 2},
        include_dashboard=False,
        log_to_driver=False,
    )
    reap_children()
    yield ray
    ray.shutdown()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for build in _BACKGROUND:
        if build.poll() is None:  # a session cut short: its build must not outlive it
            build.kill()
            build.wait()
