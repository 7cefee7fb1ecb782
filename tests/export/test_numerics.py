"""What production must set to compute as the probes did (TF32), per accelerator."""

from __future__ import annotations

import pytest

from autotune.backends import DEFAULT_BACKEND, get_backend
from autotune.export._numerics import numerics_actions, production_env
from autotune.study.storage import StudyConfig


def _config(accelerator: str, precision: str) -> StudyConfig:
    return StudyConfig(
        workload="gpt-tiny",
        space={},
        accelerator=accelerator,
        gpus_per_trial=2,
        global_batch=16,
        vram_limit_bytes=2**30,
        float32_matmul_precision=precision,
    )


OVERRIDE = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"


def test_cuda_studies_set_the_cublas_override_to_their_choice() -> None:
    """1 with --tf32; 0 without it, explicitly (NGC's PyTorch containers export 1); CPU
    matmuls follow no variable."""
    assert production_env(_config("cuda", "high")) == {OVERRIDE: "1"}
    assert production_env(_config("cuda", "highest")) == {OVERRIDE: "0"}
    assert production_env(_config("cpu", "high")) == {}


def _exported(text: str, parent: dict[str, str]) -> dict[str, str]:
    """The variables launch.sh's export lines leave in a shell started with ``parent``."""
    import subprocess

    lines = [line for line in text.splitlines() if line.startswith("export ")]
    names = [line.split()[1].split("=")[0] for line in lines]
    shown = "".join(f'printf "%s=%s\\n" {name} "${{{name}}}"\n' for name in names)
    done = subprocess.run(
        ["bash", "-c", "\n".join(lines) + "\n" + shown],
        env={"PATH": "/usr/bin:/bin", **parent},
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


@pytest.mark.parametrize("backend", ["deepspeed", "fsdp2"])
@pytest.mark.parametrize(("precision", "value"), [("highest", "0"), ("high", "1")])
def test_launch_sh_sets_the_override_whatever_the_shell_exports(backend, precision, value):
    """Both backends' launch.sh set the study's value over the one an NGC container's shell
    exports (1); the threads keep a value the shell gives."""
    text = get_backend(backend).launch_script(
        "o", 2, "cuda", 4, production_env(_config("cuda", precision)), None
    )
    assert f"export {OVERRIDE}={value}\n" in text
    exported = _exported(text, {OVERRIDE: "1", "OMP_NUM_THREADS": "7"})
    assert exported[OVERRIDE] == value
    assert exported["OMP_NUM_THREADS"] == "7"


@pytest.mark.parametrize(
    ("accelerator", "precision", "words"),
    [
        ("cuda", "high", "launch.sh exports"),
        ("cuda", "highest", "do not turn TF32 on"),
        ("cpu", "high", "no environment variable sets it for CPU matmuls"),
    ],
)
def test_summary_says_how_production_matches(accelerator: str, precision: str, words: str):
    (line,) = numerics_actions(_config(accelerator, precision))
    assert words in line


def test_cpu_ieee_studies_add_no_line() -> None:
    assert numerics_actions(_config("cpu", "highest")) == []


def test_script_launch_keeps_the_callers_accelerator_and_sets_the_numerics() -> None:
    text = get_backend(DEFAULT_BACKEND).script_launch_script(
        origin="o",
        script_name="train.py",
        script_path="/x/train.py",
        cwd="/x",
        shell_args="--a 1",
        passes_config=False,
        ranks=2,
        accelerator="cpu",
        threads_per_rank=1,
        env={"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"},
    )
    assert 'export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"' in text
    assert f"export {OVERRIDE}=1\n" in text
    exported = _exported(text, {OVERRIDE: "0", "DS_ACCELERATOR": "cuda"})
    assert exported["DS_ACCELERATOR"] == "cuda"  # kept: the caller's
    assert exported[OVERRIDE] == "1"  # set: what production must compute with
