"""DeepSpeed's JIT-compiled ops on this machine: building them once, with progress, before
any probe needs them; the build tools those builds use; and the optional DeepSpeed features
(async I/O, partial offload) a space may ask for. Every build or load holds the op's kernel
lock (:mod:`autotune.backends.deepspeed._op_locks`). What happens meanwhile is told as typed events
(:mod:`autotune.events`), which the CLI renders.

Heavy imports (torch, deepspeed) stay inside functions: the CLI imports this module.
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune import events
from autotune.backends.deepspeed._cpu_info import remember_cpu_info
from autotune.backends.deepspeed._op_locks import op_lock
from autotune.cache_dir import cache_root
from autotune.errors import HardwareError

if TYPE_CHECKING:
    from autotune.hardware import Hardware

# Part of the op folder's name: ops built with other flags (DeepSpeed's own, with debug
# information) live in another folder and are not rebuilt in place.
BUILD_FLAGS = "no-debug-info"


class OpsReport(BaseModel):
    """What :func:`ensure_deepspeed_ops` did: which ops it compiled and which were cached."""

    model_config = ConfigDict(extra="forbid")

    built: list[str] = Field(default_factory=list, description="Ops compiled by this call.")
    cached: list[str] = Field(default_factory=list, description="Ops already built.")
    seconds: float = Field(default=0.0, description="Wall time of the whole call.")
    torch_adam: bool = Field(
        default=False,
        description="FusedAdam does not build here: configs must use torch's Adam "
        "(see use_torch_adam).",
    )
    unavailable: list[str] = Field(
        default_factory=list,
        description="Optional ops that do not build here (each told as OpUnavailable).",
    )


def torch_extensions_dir() -> str:
    """Where torch JIT-builds DeepSpeed's ops: ``TORCH_EXTENSIONS_DIR`` when set, else one
    folder per Python environment, torch, DeepSpeed and ninja versions and build flags, so
    that two virtual environments never rebuild each other's ops (torch keeps a single folder
    per op and rebuilds when the build flags differ, and ninja discards another version's
    build log and rebuilds everything)."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return os.environ["TORCH_EXTENSIONS_DIR"]
    parts = [sys.prefix, BUILD_FLAGS]
    for package in ("torch", "deepspeed", "ninja"):
        try:
            parts.append(version(package))
        except PackageNotFoundError:
            parts.append(f"no-{package}")
    key = hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]
    return os.path.join(cache_root(), "torch_extensions", key)


def tools_path(path: str | None) -> str:
    """``path`` (a PATH value) with this interpreter's folder first: pip installs ``ninja``
    there, and torch calls ``ninja`` from PATH, so a venv's autotune started without
    activating the venv still builds with the venv's ninja, not another one."""
    own = os.path.dirname(sys.executable)
    rest = [entry for entry in (path or "").split(os.pathsep) if entry and entry != own]
    return os.pathsep.join([own, *rest] if own else rest)


def build_tool_problem(path: str, *, compiler: bool) -> str | None:
    """Which build tool is missing from ``path`` (ninja always; the C++ compiler when
    ``compiler``, i.e. something must be compiled), as one actionable line, or None."""
    if shutil.which("ninja", path=path) is None:
        return (
            "DeepSpeed builds its ops with ninja, which this environment lacks: "
            f"`{sys.executable} -m pip install ninja`"
        )
    cxx = os.environ.get("CXX", "c++")  # what torch's cpp_extension compiles with
    if compiler and shutil.which(cxx, path=path) is None:
        return (
            f"DeepSpeed builds its ops with a C++ compiler (`{cxx}`), which this machine lacks: "
            "install one (e.g. `apt install g++`), or set CXX to its path"
        )
    return None


def build_environment(accelerator: str | None = None) -> str:
    """Point this process's builds at the environment's tools and at autotune's op folder
    (DeepSpeed and torch read both from the environment); returns that folder."""
    if accelerator is not None:
        os.environ.setdefault("DS_ACCELERATOR", accelerator)
    os.environ["TORCH_EXTENSIONS_DIR"] = torch_extensions_dir()
    os.environ["PATH"] = tools_path(os.environ.get("PATH"))
    return os.environ["TORCH_EXTENSIONS_DIR"]


def guard_op_loads() -> str:
    """Make every JIT load of a DeepSpeed op in this process hold that op's kernel lock
    (:func:`op_lock`), with the environment's build tools; returns the op folder.

    DeepSpeed loads ops deep inside ``deepspeed.initialize`` (optimizers, communication), so
    the lock goes around its one JIT entry point, ``OpBuilder.jit_load``; torch builds each
    op as it would without autotune, debug information aside. The CPU facts each load asks
    for are asked once per boot (:mod:`autotune.backends.deepspeed._cpu_info`)."""
    root = build_environment()
    remember_cpu_info()
    from deepspeed.ops.op_builder.builder import OpBuilder

    original = OpBuilder.jit_load
    if getattr(original, "_autotune_op_lock", False):
        return root

    def jit_load(self: Any, verbose: bool = True) -> Any:
        with op_lock(torch_extensions_dir(), self.name):
            _without_debug_info(self)
            return original(self, verbose)

    jit_load._autotune_op_lock = True  # type: ignore[attr-defined]
    OpBuilder.jit_load = jit_load  # type: ignore[method-assign]
    return root


def _without_debug_info(builder: Any) -> None:
    """Compile ``builder``'s op without ``-g``, which DeepSpeed's CPU builders pass.

    Debug information does not change the code GCC generates (the invariant its
    ``-fcompare-debug`` checks; the disassembly of an op's objects is identical here), and
    for torch's headers it is a large share of an op's compile CPU (benchmarks/RESULTS.md, "A
    probe launch: ranks forked after their imports, ops without debug information"). Every
    process that loads ops goes
    through this, so the driver's build and the ranks' loads agree on the flags (torch
    rebuilds an op whose flags differ).
    """
    cxx_args = builder.cxx_args
    if getattr(cxx_args, "_autotune_no_debug_info", False):
        return

    def without_g() -> list[str]:
        return [arg for arg in cxx_args() if arg != "-g"]

    without_g._autotune_no_debug_info = True  # type: ignore[attr-defined]
    builder.cxx_args = without_g


def _built_at(root: str, op: str) -> float | None:
    """Newest modification time of the op's compiled library, or None if it has none."""
    folder = os.path.join(root, op)
    try:
        times = [
            os.path.getmtime(os.path.join(folder, name))
            for name in os.listdir(folder)
            if name.endswith(".so")
        ]
    except OSError:
        return None
    return max(times, default=None)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _builder_names(accelerator: str, offload_targets: Iterable[str]) -> list[str]:
    """DeepSpeed op builders the probes will load: FusedAdam for the optimizer on the
    device, CPU Adam for optimizer offload (DeepSpeed steps NVMe-offloaded optimizers with
    CPU Adam too), async I/O for NVMe, the shared-memory all-reduce on CPU ranks."""
    targets = set(offload_targets)
    names = ["FusedAdamBuilder"]
    if targets & {"cpu", "nvme"}:
        names.append("CPUAdamBuilder")
    if "nvme" in targets:
        names.append("AsyncIOBuilder")
    if accelerator == "cpu":
        names.append("ShareMemCommBuilder")
    return names


def ensure_deepspeed_ops(
    hardware: Hardware,
    *,
    offload_targets: Iterable[str] | None = None,
    emit: events.Emit = events.ignore,
    cpu_offload: bool | None = None,
    create_builder: Callable[[str], Any] | None = None,
) -> OpsReport:
    """Build (once; then cached) the DeepSpeed ops the probes will JIT-load, so that no
    probe pays a compile inside its timed run and its timeout, and the caller can start its
    budget clock after this returns.

    ``offload_targets``: the devices candidates offload to (``cpu``, ``nvme``);
    ``cpu_offload=True`` is the same as ``{"cpu"}``. ``emit`` is told before and after each
    op that must be compiled, when waiting for another process's build, when a killed
    build's lock is cleared and when an optional op does not build.
    ``create_builder`` maps a DeepSpeed builder class name to a builder (default: the
    accelerator's). A FusedAdam that does not build (on CUDA: nvcc missing or not matching
    torch's CUDA) sets ``torch_adam`` instead of failing; any other op that does not build
    raises :class:`HardwareError`, as does a missing ninja or C++ compiler.
    """
    started = time.monotonic()
    targets = set(offload_targets or ())
    if cpu_offload:
        targets.add("cpu")
    os.environ.setdefault("DS_ACCELERATOR", hardware.accelerator)
    root = guard_op_loads()
    problem = build_tool_problem(os.environ["PATH"], compiler=False)
    if problem:
        raise HardwareError(problem)
    if create_builder is None:
        try:
            import deepspeed.ops  # noqa: F401 - DeepSpeed's op modules register on import
            from deepspeed.accelerator import get_accelerator
        except ImportError as exc:  # pragma: no cover - deepspeed is a dependency
            raise HardwareError(f"cannot import DeepSpeed ({exc}); pip install deepspeed") from None
        create_builder = get_accelerator().create_op_builder
    report = OpsReport()
    for name in _builder_names(hardware.accelerator, targets):
        builder = create_builder(name)
        if builder is not None:
            _ensure_op(builder, root, report, emit)
    report.seconds = time.monotonic() - started
    return report


def _ensure_op(builder: Any, root: str, report: OpsReport, emit: events.Emit) -> None:
    """Load one op (compiling it when it is not cached) and record what happened."""
    op = builder.name
    before = _built_at(root, op)
    if before is None:
        problem = build_tool_problem(os.environ["PATH"], compiler=True)
        if problem:
            raise HardwareError(problem)
        emit(events.OpBuildStarted(op))
    started = time.monotonic()
    try:
        with op_lock(root, op, on_wait=lambda: emit(events.OpBuildWaiting(op))) as cleared:
            if cleared:
                emit(events.BuildLockCleared(op))
            builder.load(verbose=False)
    except Exception as exc:  # noqa: BLE001 - compiler errors come in many types
        _op_failed(builder, op, exc, root, report, emit)
        return
    after = _built_at(root, op)
    if after is not None and after != before:
        report.built.append(op)
        emit(events.OpBuildFinished(op, time.monotonic() - started))
    else:
        report.cached.append(op)


def _op_failed(
    builder: Any, op: str, exc: Exception, root: str, report: OpsReport, emit: events.Emit
) -> None:
    """FusedAdam and async I/O may be missing (torch's Adam, no NVMe); other ops may not."""
    why = _first_line(exc)
    kind = type(builder).__name__
    fallback: Literal["torch_adam", "no_nvme"] | None = None
    if op == "fused_adam" or kind == "FusedAdamBuilder":
        report.torch_adam = True
        fallback = "torch_adam"
    elif op == "async_io" or kind == "AsyncIOBuilder":
        fallback = "no_nvme"
    if fallback is not None:
        report.unavailable.append(op)
        emit(events.OpUnavailable(op, why, os.path.join(root, op), fallback))
        return
    raise HardwareError(
        f"DeepSpeed cannot build its {op} op here ({why}; log in {root}/{op}/); fix the "
        "build, or remove the option that needs it from the space"
    ) from None


def use_torch_adam(ds_config: dict[str, Any]) -> dict[str, Any]:
    """``ds_config`` with torch's Adam in place of DeepSpeed's FusedAdam, for machines where
    FusedAdam does not build. Only an Adam/AdamW optimizer stepped on the device changes:
    with optimizer offload (cpu or nvme) DeepSpeed steps with its CPU Adam, which
    ``torch_adam`` would replace too. Returns a new dict."""
    config = copy.deepcopy(ds_config)
    optimizer = config.get("optimizer")
    if not isinstance(optimizer, dict):
        return config
    if str(optimizer.get("type", "")).lower() not in ("adam", "adamw"):
        return config
    zero = config.get("zero_optimization") or {}
    offload = zero.get("offload_optimizer") or {}
    if zero.get("stage") not in (None, 0) and offload.get("device") in ("cpu", "nvme"):
        return config
    params = optimizer.get("params") or {}
    params["torch_adam"] = True  # DeepSpeed's key (deepspeed.runtime.config.TORCH_ADAM_PARAM)
    optimizer["params"] = params
    return config


def partial_offload_supported() -> bool:
    """Whether this DeepSpeed knows ``offload_optimizer.ratio`` (partial offload, ZeRO-3)."""
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadOptimizerConfig

    return "ratio" in DeepSpeedZeroOffloadOptimizerConfig.model_fields


def async_io_problem(hardware: Hardware) -> str | None:
    """Why DeepSpeed's async I/O op (needed for NVMe offload) cannot be used, or None."""
    os.environ.setdefault("DS_ACCELERATOR", hardware.accelerator)
    guard_op_loads()
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("AsyncIOBuilder")
    if builder is None:
        return f"DeepSpeed has no async I/O op for the {hardware.accelerator} accelerator"
    if not builder.is_compatible(verbose=False):
        return "DeepSpeed's async I/O op needs libaio (apt install libaio-dev)"
    problem = build_tool_problem(os.environ["PATH"], compiler=True)
    if problem:
        return problem
    try:
        builder.load(verbose=False)
    except Exception as exc:  # noqa: BLE001 - compiler errors come in many types
        return f"DeepSpeed's async I/O op does not build here ({_first_line(exc)})"
    return None


# The DeepSpeed ops a CPU probe's first job loads, named for its fork launcher (see
# autotune.probe.fork_ranks): loaded there once, before the ranks are forked, they come with each
# rank. A JIT load of a built Adam op re-runs torch's and ninja's up-to-date checks in every
# process that loads it; DeepSpeed keeps a loaded op (OpBuilder._loaded_ops), so a
# forked rank's own load returns at once.
PRELOAD_OPS_VARIABLE = "AUTOTUNE_PRELOAD_OPS"


def adam_builder(ds_config: dict[str, Any]) -> str | None:
    """The DeepSpeed op builder that steps ``ds_config``'s optimizer on CPU ranks: CPU Adam
    with the optimizer offloaded, FusedAdam otherwise; None for another optimizer or
    torch's Adam."""
    optimizer = ds_config.get("optimizer") or {}
    if str(optimizer.get("type", "")).lower() not in ("adam", "adamw"):
        return None
    if (optimizer.get("params") or {}).get("torch_adam"):
        return None
    offload = (ds_config.get("zero_optimization") or {}).get("offload_optimizer") or {}
    return "CPUAdamBuilder" if offload.get("device") in ("cpu", "nvme") else "FusedAdamBuilder"


def preload_built_ops(names: Iterable[str]) -> list[str]:
    """Load the named ops that are built in this environment's op folder (never build one:
    a rank that needs it builds it, under the op lock); the names of those loaded. A load
    that fails is left to the rank, which reports it."""
    from deepspeed.accelerator import get_accelerator

    guard_op_loads()
    loaded = []
    for name in names:
        builder = get_accelerator().create_op_builder(name)
        if builder is None:
            continue
        built = os.path.join(torch_extensions_dir(), builder.name, f"{builder.name}.so")
        if not os.path.exists(built):
            continue
        try:
            builder.load(verbose=False)
        except Exception:  # noqa: BLE001 - the rank loads it again and says why
            continue
        loaded.append(name)
    return loaded
