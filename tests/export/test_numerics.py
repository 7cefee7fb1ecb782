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


def test_only_cuda_tf32_studies_export_the_cublas_override() -> None:
    assert production_env(_config("cuda", "high")) == {"TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}
    assert production_env(_config("cuda", "highest")) == {}
    assert production_env(_config("cpu", "high")) == {}


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


def test_script_launch_exports_the_environment_unless_set() -> None:
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
    name = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"
    assert f'export {name}="${{{name}:-1}}"' in text
