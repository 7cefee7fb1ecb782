"""What production must set so that its numerics match the probes': TF32 for fp32 matmuls.

The probes run ``torch.set_float32_matmul_precision`` as the study says (``--tf32``: "high",
TF32 tensor cores for fp32 matmuls; else "highest", IEEE fp32, PyTorch's default). A
production run left at PyTorch's default would run fp32 matmuls several times slower than
the probes timed them, and the chosen configuration could be the wrong one. On CUDA,
``launch.sh`` sets ``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE`` to 1 with ``--tf32`` (cuBLAS then uses
TF32 for fp32 matmuls whatever the script sets; read once by ATen's
``Context::allowTF32CuBLAS``) and to 0 without it, whatever the environment holds: NGC's
PyTorch containers export 1, which would turn TF32 on where the probes ran IEEE fp32 (the
probes' own environment sets it the same way, :func:`autotune.execution.launch.probe_env`).
No environment variable does the same for CPU matmuls, so there the summary asks for the call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.settings import TF32_CUBLAS_OVERRIDE_ENV, tf32_cublas_override

if TYPE_CHECKING:
    from autotune.study import StudyConfig


def probes_used_tf32(config: StudyConfig) -> bool:
    return config.float32_matmul_precision == "high"


def production_env(config: StudyConfig) -> dict[str, str]:
    """Environment variables ``launch.sh`` sets (whatever the environment already holds) so
    that production computes as the probes did: on CUDA the TF32 override, 0 or 1."""
    if config.accelerator == "cuda":
        return {TF32_CUBLAS_OVERRIDE_ENV: tf32_cublas_override(config.float32_matmul_precision)}
    return {}


def numerics_actions(config: StudyConfig) -> list[str]:
    """The summary's "What you must do" lines on matmul precision."""
    call = "`torch.set_float32_matmul_precision('high')`"
    if not probes_used_tf32(config):
        if config.accelerator != "cuda":
            return []
        return [
            "The probes ran fp32 matmuls in IEEE fp32 (PyTorch's default): do not turn TF32 "
            f"on (no {call}), or the timings no longer hold; launch.sh exports "
            f"`{TF32_CUBLAS_OVERRIDE_ENV}=0` (NGC's PyTorch containers set it to 1), and so "
            "must any other launch."
        ]
    if config.accelerator == "cuda":
        return [
            "The probes ran fp32 matmuls on TF32 tensor cores (--tf32): launch.sh exports "
            f"`{TF32_CUBLAS_OVERRIDE_ENV}=1` so production does too; if you launch otherwise, "
            f"call {call} at the start of your script."
        ]
    return [
        "The probes ran with --tf32 (`float32_matmul_precision` 'high'): call "
        f"{call} at the start of your script, as the probes did (no environment variable "
        "sets it for CPU matmuls)."
    ]
