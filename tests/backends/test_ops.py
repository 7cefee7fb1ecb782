"""Building DeepSpeed's ops: the environment's own build tools, a missing tool named as such,
progress before each compile, CPU Adam for NVMe offload, and torch's Adam where FusedAdam
does not build.

There is no CUDA here, so FusedAdam's nvcc failure comes from a test double of DeepSpeed's
op builder (named ...Double); everything else is the real torch, DeepSpeed and ninja.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import events
from autotune.backends.deepspeed.ops import (
    _without_debug_info,
    build_tool_problem,
    ensure_deepspeed_ops,
    tools_path,
    torch_extensions_dir,
    use_torch_adam,
)
from autotune.cli._render import BUILD_ESTIMATE, line
from autotune.errors import HardwareError
from autotune.hardware import Hardware

VENV_BIN = os.path.dirname(sys.executable)


def hardware(accelerator: str = "cpu") -> Hardware:
    return Hardware(
        accelerator=accelerator,  # type: ignore[arg-type]
        device_count=2,
        device_name="test machine",
        device_memory_bytes=8 * 2**30,
        host_memory_bytes=16 * 2**30,
        cpu_count=2,
        precisions=("fp32",),
    )


class BuilderDouble:
    """Test double of a DeepSpeed op builder: ``load`` writes the op's library into the op
    folder as torch's build does, or raises what a failed build raises."""

    def __init__(self, root: Path, name: str, error: str | None = None) -> None:
        self.root, self.name, self.error = root, name, error
        self.loads = 0

    def load(self, verbose: bool = False) -> None:
        self.loads += 1
        if self.error is not None:
            raise RuntimeError(self.error)
        folder = self.root / self.name
        if not (folder / f"{self.name}.so").exists():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{self.name}.so").write_bytes(b"")


class FailingFusedAdamBuilderDouble(BuilderDouble):
    """Test double of CUDA's FusedAdam builder on a machine whose nvcc does not match."""


@pytest.fixture
def ops_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty op folder; the variables ensure_deepspeed_ops sets are restored after."""
    root = tmp_path / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    monkeypatch.setenv("PATH", os.environ.get("PATH", ""))
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    return root


def test_torch_extensions_dir_honours_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/somewhere/else")
    assert torch_extensions_dir() == "/somewhere/else"
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert torch_extensions_dir().startswith(os.path.expanduser("~/.cache/autotune/"))
    monkeypatch.setenv("XDG_CACHE_HOME", "/elsewhere/cache")
    assert torch_extensions_dir().startswith("/elsewhere/cache/autotune/torch_extensions/")


def test_tools_path_puts_the_interpreters_folder_first_once() -> None:
    assert tools_path("/usr/bin:/bin").split(os.pathsep) == [VENV_BIN, "/usr/bin", "/bin"]
    twice = tools_path(f"/usr/bin:{VENV_BIN}:/bin").split(os.pathsep)
    assert twice == [VENV_BIN, "/usr/bin", "/bin"]
    assert tools_path(None) == VENV_BIN


def test_a_venv_started_without_activation_builds_with_the_venvs_ninja(tmp_path: Path) -> None:
    """The venv's python started by absolute path, PATH without the venv's bin (a newcomer
    who did not activate it): torch's own ninja check passes and finds the venv's ninja."""
    assert os.path.exists(os.path.join(VENV_BIN, "ninja")), "pip's ninja is not in the venv"
    code = (
        "import shutil\n"
        "from torch.utils.cpp_extension import verify_ninja_availability\n"
        "from autotune.backends.deepspeed.ops import build_environment\n"
        "build_environment()\n"
        "verify_ninja_availability()\n"
        "print(shutil.which('ninja'))\n"
    )
    env = {**os.environ, "PATH": str(tmp_path), "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}
    env.pop("VIRTUAL_ENV", None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == os.path.join(VENV_BIN, "ninja")


def test_probe_ranks_get_the_interpreters_folder_first_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.execution.launch import probe_env
    from tests.support.probe_jobs import make_job

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = probe_env(make_job(tmp_path), None)
    assert env["PATH"].split(os.pathsep)[0] == VENV_BIN
    assert env["TORCH_EXTENSIONS_DIR"] == torch_extensions_dir()


def test_a_missing_ninja_and_a_missing_compiler_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    problem = build_tool_problem(str(empty), compiler=True)
    assert problem == (
        "DeepSpeed builds its ops with ninja, which this environment lacks: "
        f"`{sys.executable} -m pip install ninja`"
    )
    only_ninja = tmp_path / "only_ninja"
    only_ninja.mkdir()
    ninja_double = only_ninja / "ninja"  # test double: an executable named ninja
    ninja_double.write_text("#!/bin/sh\n")
    ninja_double.chmod(0o755)
    monkeypatch.delenv("CXX", raising=False)
    problem = build_tool_problem(str(only_ninja), compiler=True)
    assert problem is not None and "C++ compiler (`c++`)" in problem and "ninja" not in problem
    assert build_tool_problem(str(only_ninja), compiler=False) is None
    assert build_tool_problem(os.pathsep.join([VENV_BIN, "/usr/bin"]), compiler=True) is None


def test_ensure_stops_on_a_missing_ninja_with_the_install_line(
    ops_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interpreter whose folder has no ninja, on a PATH that has none either."""
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bare" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(HardwareError, match="ninja, which this environment lacks") as raised:
        ensure_deepspeed_ops(hardware(), offload_targets=set(), create_builder=lambda name: None)
    assert "\n" not in str(raised.value)


def test_progress_comes_before_each_build_and_cached_ops_are_not_rebuilt(ops_root: Path) -> None:
    builders: dict[str, BuilderDouble] = {}

    def create(name: str) -> BuilderDouble:
        op = {"FusedAdamBuilder": "fused_adam", "CPUAdamBuilder": "cpu_adam"}.get(name, name)
        return builders.setdefault(name, BuilderDouble(ops_root, op))

    told: list[events.Event] = []
    report = ensure_deepspeed_ops(
        hardware("cuda"), offload_targets={"cpu"}, emit=told.append, create_builder=create
    )
    assert report.built == ["fused_adam", "cpu_adam"] and report.cached == []
    assert [type(event) for event in told] == [
        events.OpBuildStarted,
        events.OpBuildFinished,
        events.OpBuildStarted,
        events.OpBuildFinished,
    ]
    lines = [line(event) for event in told]
    assert lines[0] == f"building DeepSpeed's fused_adam op ({BUILD_ESTIMATE}) ..."
    assert lines[2] == f"building DeepSpeed's cpu_adam op ({BUILD_ESTIMATE}) ..."
    assert lines[3] is not None and lines[3].startswith("built DeepSpeed's cpu_adam op in ")
    finished = [event.op for event in told if isinstance(event, events.OpBuildFinished)]
    assert finished == ["fused_adam", "cpu_adam"] and not report.torch_adam

    told.clear()
    again = ensure_deepspeed_ops(
        hardware("cuda"), offload_targets={"cpu"}, emit=told.append, create_builder=create
    )
    assert again.built == [] and again.cached == ["fused_adam", "cpu_adam"]
    assert told == []


@pytest.mark.parametrize(
    ("targets", "expected"),
    [
        (set(), ["FusedAdamBuilder"]),
        ({"cpu"}, ["FusedAdamBuilder", "CPUAdamBuilder"]),
        ({"nvme"}, ["FusedAdamBuilder", "CPUAdamBuilder", "AsyncIOBuilder"]),
    ],
)
def test_cpu_adam_is_built_for_nvme_offload_as_for_cpu(
    ops_root: Path, targets: set[str], expected: list[str]
) -> None:
    asked: list[str] = []

    def create(name: str) -> BuilderDouble:
        asked.append(name)
        return BuilderDouble(ops_root, name.lower())

    ensure_deepspeed_ops(hardware("cuda"), offload_targets=targets, create_builder=create)
    assert asked == expected


def test_the_old_cpu_offload_flag_still_asks_for_cpu_adam(ops_root: Path) -> None:
    asked: list[str] = []

    def create(name: str) -> None:
        asked.append(name)

    ensure_deepspeed_ops(hardware("cpu"), cpu_offload=True, create_builder=create)
    assert asked == ["FusedAdamBuilder", "CPUAdamBuilder", "ShareMemCommBuilder"]


def test_a_fused_adam_that_does_not_build_falls_back_to_torch_adam(ops_root: Path) -> None:
    nvcc_error = "Error building extension 'fused_adam': nvcc fatal: Unsupported gpu architecture"

    def create(name: str) -> BuilderDouble | None:
        if name == "FusedAdamBuilder":
            return FailingFusedAdamBuilderDouble(ops_root, "fused_adam", error=nvcc_error)
        return BuilderDouble(ops_root, "cpu_adam") if name == "CPUAdamBuilder" else None

    told: list[events.Event] = []
    report = ensure_deepspeed_ops(
        hardware("cuda"), offload_targets={"cpu"}, emit=told.append, create_builder=create
    )
    assert report.torch_adam
    assert report.built == ["cpu_adam"] and report.unavailable == ["fused_adam"]
    unavailable = [event for event in told if isinstance(event, events.OpUnavailable)]
    assert unavailable == [
        events.OpUnavailable(
            "fused_adam", f"RuntimeError: {nvcc_error}", str(ops_root / "fused_adam"), "torch_adam"
        )
    ]
    note = line(unavailable[0])
    assert note is not None and note.startswith("note: DeepSpeed's FusedAdam does not build here")
    assert "torch's Adam" in note and "nvcc fatal" in note and "\n" not in note
    assert f"log in {ops_root}/fused_adam/)" in note


def test_an_async_io_op_that_does_not_build_leaves_nvme_out(ops_root: Path) -> None:
    def create(name: str) -> BuilderDouble | None:
        if name == "AsyncIOBuilder":
            return BuilderDouble(ops_root, "async_io", error="libaio.so: not found\nmore")
        return None

    told: list[events.Event] = []
    report = ensure_deepspeed_ops(
        hardware("cuda"), offload_targets={"nvme"}, emit=told.append, create_builder=create
    )
    assert report.unavailable == ["async_io"] and not report.torch_adam
    assert [line(event) for event in told] == [
        f"building DeepSpeed's async_io op ({BUILD_ESTIMATE}) ...",
        "note: NVMe offload is unavailable: DeepSpeed's async I/O op (RuntimeError: "
        "libaio.so: not found)",
    ]


def test_any_other_op_that_does_not_build_stops_with_one_line(ops_root: Path) -> None:
    def create(name: str) -> BuilderDouble | None:
        if name == "CPUAdamBuilder":
            return BuilderDouble(ops_root, "cpu_adam", error="Error building extension\nmore")
        return None

    with pytest.raises(HardwareError, match="cannot build its cpu_adam op") as raised:
        ensure_deepspeed_ops(hardware("cuda"), offload_targets={"cpu"}, create_builder=create)
    assert "\n" not in str(raised.value)


def test_use_torch_adam_sets_deepspeeds_key_on_adam_stepped_on_the_device() -> None:
    from deepspeed.runtime.config import TORCH_ADAM_PARAM

    config = {
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 2},
    }
    changed = use_torch_adam(config)
    assert changed["optimizer"]["params"] == {"lr": 1e-4, TORCH_ADAM_PARAM: True}
    assert "torch_adam" not in config["optimizer"]["params"], "the input was changed"
    assert use_torch_adam({"optimizer": {"type": "adam"}})["optimizer"]["params"] == {
        TORCH_ADAM_PARAM: True
    }
    sgd = {"optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    assert use_torch_adam(sgd) == sgd
    assert use_torch_adam({"train_batch_size": 8}) == {"train_batch_size": 8}
    offloaded = {
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}},
    }
    assert use_torch_adam(offloaded) == offloaded, "CPU Adam steps offloaded optimizers"


def test_ops_compile_without_debug_information_and_with_every_other_flag() -> None:
    class Builder:
        def cxx_args(self) -> list[str]:
            return ["-O3", "-g", "-Wno-reorder", "-march=native", "-fopenmp"]

    builder = Builder()
    _without_debug_info(builder)
    _without_debug_info(builder)  # a second load of the same builder
    assert builder.cxx_args() == ["-O3", "-Wno-reorder", "-march=native", "-fopenmp"]


def test_the_adam_op_a_probe_steps_with_is_named_for_its_launcher() -> None:
    from autotune.backends.deepspeed.ops import adam_builder

    adamw = {"type": "AdamW", "params": {"lr": 1e-4}}
    assert adam_builder({"optimizer": adamw}) == "FusedAdamBuilder"
    offloaded = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    assert adam_builder({"optimizer": adamw, "zero_optimization": offloaded}) == "CPUAdamBuilder"
    torch_adam = {"type": "Adam", "params": {"torch_adam": True}}
    assert adam_builder({"optimizer": torch_adam}) is None
    assert adam_builder({"optimizer": {"type": "SGD"}}) is None


def test_a_launcher_preloads_only_ops_already_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An op not built in the op folder is left to the rank (which builds it under the op
    lock): the launcher never compiles."""
    from autotune.backends.deepspeed.ops import preload_built_ops

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert preload_built_ops(["FusedAdamBuilder", "CPUAdamBuilder"]) == []
    assert list(tmp_path.iterdir()) == []
