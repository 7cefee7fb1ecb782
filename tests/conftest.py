"""Shared fixtures: one Ray instance per session, the CLI in a subprocess, process checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


NEWCOMER_TEST = "test_newcomer.py"
# Test packages whose tests share a package-scoped fixture (views: one real study) run as one
# unit of work under pytest-xdist; every other test file is a unit of its own.
SHARED_PACKAGES = ("views",)
# Every unit with a slow test, by its wall time in a clean-clone CI run (`--durations`, the
# waits for the ops included), longest first: the longest start first and the short ones
# fill the end, so that the workers finish close together (a unit missing here runs
# after them). The two units that load the async I/O op come late, after its background
# build (below).
LONGEST_FIRST = (
    "test_run_e2e.py",
    "faults/test_faults.py",
    "test_cluster.py",
    "test_probe.py",
    "views",
    "test_deepspeed_matrix.py",
    "faults/test_script_faults.py",
    "test_models_cli.py",
    "test_examples.py",
    "test_plan_and_prune.py",
    "test_postgres.py",
    "test_gpu_check.py",
    "test_loopback_only.py",
    "test_build_locks.py",
    "test_executor_ray.py",
    "test_nvme.py",
)


# DeepSpeed's async I/O op (NVMe offload), the one op README's command 1 does not build and
# only two tests load (15 compile units, ~210 core-s on 2 cores with its precompiled torch
# header), is built into the default cache in the background from the moment the
# newcomer's ops are in, beside that run's study
# (whose budget is wall-clock: what the build takes from it costs no time) and the other
# worker's tests, none of which waits for it. At the lowest CPU priority it got almost
# nothing beside two busy workers and the first test that loaded the op waited 293 s for it.
# The tests that load it (marked ``nvme_op``) run late and wait for it through the op's
# lock; where no newcomer's run started it they build it themselves.
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
_NEWCOMER_SEEDS: list[bool] = []  # the newcomer's run is in this session: it seeds the ops
_NVME_LATER: list[bool] = []  # and a slow test after it needs the async I/O op


def _unit(nodeid: str) -> str:
    """The unit of work a test (by its node id, ``tests/...py::name``) belongs to under
    pytest-xdist: its file, or its package where the package shares a fixture."""
    relative = nodeid.split("::", 1)[0].removeprefix("tests/")
    package = relative.split("/", 1)[0]
    return package if package in SHARED_PACKAGES else relative


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scope scheduling with our units as scopes (its ``xdist_group`` marks do not
    take under pytest 9), in collection order (``--no-loadscope-reorder``)."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return UnitScheduling(config, log)


def _order(unit: str, slow_units: set[str]) -> tuple[int, int]:
    if unit == NEWCOMER_TEST:
        return (0, 0)
    if unit not in slow_units:
        return (1, 0)
    if unit in LONGEST_FIRST:
        return (2, LONGEST_FIRST.index(unit))
    return (3, 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The newcomer's run goes first: it builds DeepSpeed's ops from an empty cache anyway,
    # and seeds the default cache with them, so the suite never compiles them twice. Units
    # without a slow test come next: the other xdist workers run them while the ops build.
    # Then the longest units, so that the workers end close together.
    slow_units = {_unit(item.nodeid) for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: _order(_unit(item.nodeid), slow_units))
    slow = [item for item in items if "slow" in item.keywords]
    if slow and slow[0].path.name == NEWCOMER_TEST:
        _NEWCOMER_SEEDS.append(True)
        if any(NVME_OP in item.keywords for item in slow):
            _NVME_LATER.append(True)
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def seeded_ops_marker() -> Path:
    """A file the newcomer's test writes once its ops are in the default cache (or it
    failed before): shared by the xdist workers of one run, one file per run."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
    return Path(tempfile.gettempdir()) / f"autotune-tests-{run}" / "ops-seeded"


def mark_ops_seeded() -> None:
    marker = seeded_ops_marker()
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()


def start_background_build() -> None:
    """The async I/O op's build, started once by the newcomer's test as soon as its ops are
    in the default cache, where a slow test after it needs the op."""
    if not _NVME_LATER or _BACKGROUND:
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


@pytest.fixture
def start_nvme_build() -> Callable[[], None]:
    """:func:`start_background_build` of this module as pytest loaded it (``conftest``):
    a test that imports it from ``tests.conftest`` gets a second copy of this module, whose
    collection state is empty and whose build the session's end would not stop."""
    return start_background_build


# Marks a test that loads DeepSpeed's async I/O op (NVMe offload).
NVME_OP = "nvme_op"
_OPS_READY: set[str] = set()  # offload targets whose ops this process has ensured
SEED_WAIT_S = 30 * 60  # the newcomer's own timeout


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the first slow test (bar the newcomer's), build DeepSpeed's ops into the
    default cache, or find them there: tests that launch probes directly must not compile an
    op inside a probe's timeout. Where the newcomer's run is in this session (in this
    process or another xdist worker), its ops are waited for, not built a second time. A
    test marked ``nvme_op`` also needs the async I/O op: built by then in the background, or
    waited for (its lock), or built here."""
    if "slow" not in item.keywords or item.path.name == NEWCOMER_TEST:
        return
    targets = {"cpu", "nvme"} if NVME_OP in item.keywords else {"cpu"}
    if targets <= _OPS_READY:
        return
    from autotune.backends.deepspeed.ops import ensure_deepspeed_ops
    from autotune.cli._render import line as rendered
    from autotune.hardware import detect

    reporter = item.config.pluginmanager.get_plugin("terminalreporter")

    def show(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)

    if _NEWCOMER_SEEDS and not seeded_ops_marker().exists():
        show("waiting for the newcomer's run to build DeepSpeed's ops ...")
        deadline = time.monotonic() + SEED_WAIT_S
        while not seeded_ops_marker().exists() and time.monotonic() < deadline:
            time.sleep(1)
    ensure_deepspeed_ops(detect(), offload_targets=targets, emit=lambda e: show(rendered(e) or ""))
    _OPS_READY.update(targets)


def copy_built_ops(
    source_root: str, target_root: str, only: tuple[str, ...] | None = None
) -> list[str]:
    """Copy each op ``source_root`` has built (of ``only``, if given) to ``target_root``
    where that op is not built yet; returns the ops copied. torch's op folders are
    relocatable (ninja's outputs are relative to the folder) and the copy keeps modification
    times, so ninja finds the copy up to date. Each copy is made under the target op's lock
    and moved into place whole."""
    import glob
    import shutil

    from autotune.backends.deepspeed._op_locks import op_lock

    copied = []
    if not os.path.isdir(source_root):
        return copied
    for op in sorted(os.listdir(source_root)):
        source = os.path.join(source_root, op)
        if only is not None and op not in only:
            continue
        if not os.path.isdir(source) or not glob.glob(os.path.join(source, "*.so")):
            continue
        target = os.path.join(target_root, op)
        with op_lock(target_root, op):
            if glob.glob(os.path.join(target, "*.so")):
                continue
            staging = f"{target}.copying"
            shutil.rmtree(staging, ignore_errors=True)
            shutil.copytree(source, staging, ignore=shutil.ignore_patterns("lock"))
            shutil.rmtree(target, ignore_errors=True)  # a build a killed process left unfinished
            os.replace(staging, target)
        copied.append(op)
    return copied


def reap_children() -> None:
    """Undo what ``ray.init`` does to this process: Ray ignores SIGCHLD at the OS level, every
    child inherits that across exec, and ``Popen.wait`` then gets ECHILD and reports exit
    code 0 whatever the child returned (a test of an error exit passes or fails by chance;
    py-cpuinfo inside DeepSpeed's op builder hangs)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)


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
    """One local Ray for the whole session (start-up costs ~3 s), with 2 CPU-rank slots."""
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


def run_cli(
    *args: str, cwd: Path, timeout: float = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``autotune ARGS`` as a user types it, in ``cwd``."""
    full_env = {**os.environ, **(env or {})}
    reap_children()
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
# Under pytest-xdist each worker is a session of its own, with a tag of its own (a worker
# inherits the controller's environment).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["AUTOTUNE_TEST_TAG"] = f"{uuid.uuid4().hex}-{os.environ['PYTEST_XDIST_WORKER']}"
TEST_TAG = os.environ.setdefault("AUTOTUNE_TEST_TAG", uuid.uuid4().hex)


def probe_processes() -> list[str]:
    """Command lines of live probe processes (launchers, torchrun agents and ranks) of this
    session; a forked rank has its launcher's command line."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            cmdline = " ".join(process.info["cmdline"] or [])
            modules = (
                "autotune.probe.rank",
                "autotune.probe.script_rank",
                "autotune.probe.fork_ranks",
            )
            if not any(module in cmdline for module in modules):
                continue
            if process.environ().get("AUTOTUNE_TEST_TAG") == TEST_TAG:
                found.append(cmdline)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for build in _BACKGROUND:
        if build.poll() is None:  # a session cut short: its build must not outlive it
            build.kill()
            build.wait()
