"""The communication backend every training backend starts a rank's process group with.

On CUDA the group gets NCCL for device tensors and gloo for host tensors
(``"cuda:nccl,cpu:gloo"``, torch's ``device:backend`` form, as torchtitan and torchtune
start theirs): FSDP2 under ``CPUOffloadPolicy`` keeps parameters and gradients as CPU
DTensors, and ``clip_grad_norm_`` over them, or a loss check's ``full_tensor()``, runs a
collective on CPU tensors, which an NCCL-only group refuses ("no backend for device type
cpu"). DeepSpeed and FSDP2 candidates share a warm rank's group (the first one starts it),
so both ask this module. CPU ranks: gloo.
"""

from __future__ import annotations

from typing import Literal

CUDA_WITH_HOST = "cuda:nccl,cpu:gloo"
CPU_ONLY = "gloo"


def process_group_backend(accelerator: Literal["cuda", "cpu"] | str) -> str:
    """The ``backend`` of ``init_process_group`` for ranks on ``accelerator``."""
    return CUDA_WITH_HOST if accelerator == "cuda" else CPU_ONLY
