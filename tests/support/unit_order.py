"""The test suite's units of work under pytest-xdist and their order, and which tests wait
for the newcomer's run to build DeepSpeed's ops. A pytest plugin: ``tests/conftest.py``
takes its hooks by importing them.

The decision to wait is taken from the tests that will run: after ``-k``, ``-m``,
``--deselect`` and ``--lf`` have removed theirs (``pytest_collection_finish`` comes after
every ``pytest_collection_modifyitems``), so that a selection without the newcomer's test
never waits for a build nobody starts."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

NEWCOMER_TEST = "e2e/test_newcomer.py"
# Marks a test that loads DeepSpeed's async I/O op (NVMe offload).
NVME_OP = "nvme_op"
# Test packages whose tests share a package-scoped fixture (views: one real study) run as one
# unit of work under pytest-xdist; every other test file is a unit of its own.
SHARED_PACKAGES = ("views",)
# Every unit with a slow test, by its wall time in a clean-clone CI run (`--durations`, the
# waits for the ops included), longest first: the longest start first and the short ones
# fill the end, so that the workers finish close together (a unit missing here runs
# after them). The two units that load the async I/O op come late, after its background
# build (tests/conftest.py).
LONGEST_FIRST = (
    "e2e/test_run.py",
    "e2e/faults/test_faults.py",
    "integration/test_cluster.py",
    "integration/test_probe.py",
    "benchmarks/test_gpu_check.py",
    "e2e/test_verify.py",
    "views",
    "e2e/test_verify_script.py",
    "benchmarks/test_deepspeed_matrix.py",
    "e2e/faults/test_script_faults.py",
    "e2e/test_models_cli.py",
    "e2e/test_world_sizes.py",
    "e2e/test_fsdp2_study.py",
    "e2e/test_examples.py",
    "e2e/test_warm_script.py",
    "e2e/test_plan_and_prune.py",
    "integration/test_fsdp2_probe.py",
    "integration/test_postgres.py",
    "integration/test_loopback_only.py",
    "backends/test_build_locks.py",
    "integration/test_executor_ray.py",
    "integration/test_loss_runs.py",
    "integration/test_nvme.py",
)


@dataclass
class SessionPlan:
    """What this session's selected tests imply for DeepSpeed's ops."""

    newcomer_seeds: bool = False  # the newcomer's run is selected: it seeds the ops
    nvme_later: bool = False  # and a slow test after it needs the async I/O op
    ops_ready: set[str] = field(default_factory=set)  # offload targets ensured here


_PLAN = pytest.StashKey[SessionPlan]()


def session_plan(config: pytest.Config) -> SessionPlan:
    if _PLAN not in config.stash:
        config.stash[_PLAN] = SessionPlan()
    return config.stash[_PLAN]


def unit(nodeid: str) -> str:
    """The unit of work a test (by its node id, ``tests/...py::name``) belongs to under
    pytest-xdist: its file, or its package where the package shares a fixture."""
    relative = nodeid.split("::", 1)[0].removeprefix("tests/")
    package = relative.split("/", 1)[0]
    return package if package in SHARED_PACKAGES else relative


def is_slow(item: pytest.Item) -> bool:
    return "slow" in item.keywords


def waits_for_newcomer(item: pytest.Item) -> bool:
    """Whether ``item`` is to wait for the newcomer's run to seed the ops: a slow test
    other than the newcomer's, in a session whose selection holds the newcomer's test."""
    plan = session_plan(item.config)
    return plan.newcomer_seeds and is_slow(item) and unit(item.nodeid) != NEWCOMER_TEST


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scope scheduling with our units as scopes (its ``xdist_group`` marks do not
    take under pytest 9), in collection order (``--no-loadscope-reorder``)."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    return UnitScheduling(config, log)


def _order(name: str, slow_units: set[str]) -> tuple[int, int]:
    if name == NEWCOMER_TEST:
        return (0, 0)
    if name not in slow_units:
        return (1, 0)
    if name in LONGEST_FIRST:
        return (2, LONGEST_FIRST.index(name))
    return (3, 0)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The newcomer's run goes first: it builds DeepSpeed's ops from an empty cache anyway,
    and seeds the default cache with them, so the suite never compiles them twice. Units
    without a slow test come next: the other xdist workers run them while the ops build.
    Then the longest units, so that the workers end close together. Last of this hook's
    implementations, so that it orders what ``-k``/``-m`` left."""
    slow_units = {unit(item.nodeid) for item in items if is_slow(item)}
    items.sort(key=lambda item: _order(unit(item.nodeid), slow_units))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Whether the newcomer's run seeds the ops, from the tests that will run."""
    plan = session_plan(session.config)
    slow = [item for item in session.items if is_slow(item)]
    plan.newcomer_seeds = bool(slow) and unit(slow[0].nodeid) == NEWCOMER_TEST
    plan.nvme_later = plan.newcomer_seeds and any(NVME_OP in item.keywords for item in slow)


def seeded_ops_marker() -> Path:
    """A file the newcomer's test writes once its ops are in the default cache (or it
    failed before): shared by the xdist workers of one run, one file per run."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
    return Path(tempfile.gettempdir()) / f"autotune-tests-{run}" / "ops-seeded"


def mark_ops_seeded() -> None:
    marker = seeded_ops_marker()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
