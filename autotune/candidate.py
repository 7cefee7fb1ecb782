"""One concrete point of the search space, and its DeepSpeed config.

:meth:`Candidate.to_ds_config` is the only code that spells DeepSpeed's JSON keys
(``train_micro_batch_size_per_gpu``, ``zero_optimization``, ``bf16`` ...), so that the
probe, the memory model and the export all render the same config.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

Precision = Literal["fp32", "bf16", "fp16"]
OffloadDevice = Literal["none", "cpu", "nvme"]

# Used when the user gives no base config: a plain AdamW, quiet logging. The tuned keys are
# laid over it; everything else a user's own base config holds is kept as is.
DEFAULT_BASE_CONFIG: dict[str, Any] = {
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
    "steps_per_print": 1_000_000,
    "wall_clock_breakdown": False,
}

# DeepSpeed's dynamic loss scaling for fp16 (loss_scale 0 = dynamic); see DeepSpeed's
# config-json docs, "FP16 training options". A user's own fp16 block overrides these.
FP16_DYNAMIC_LOSS_SCALING: dict[str, Any] = {
    "enabled": True,
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}


class Candidate(BaseModel):
    """Frozen and hashable: the study never probes the same candidate twice (see ``key``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    precision: Precision = Field(description="Training precision: fp32, bf16 or fp16.")
    zero_stage: Literal[0, 1, 2, 3] = Field(description="ZeRO stage.")
    offload_optimizer: OffloadDevice = Field(
        default="none", description="Where optimizer states live (ZeRO 1-3)."
    )
    offload_param: OffloadDevice = Field(
        default="none", description="Where parameters live between uses (ZeRO 3 only)."
    )
    micro_batch_size: PositiveInt = Field(description="Samples per rank per forward pass.")
    gradient_accumulation_steps: PositiveInt = Field(
        description="Micro-batches accumulated per optimizer step."
    )
    data_parallel_size: PositiveInt = Field(description="Ranks the batch is split over.")
    activation_checkpointing: bool = Field(
        default=False, description="Recompute each transformer block's activations in backward."
    )

    @property
    def train_batch_size(self) -> int:
        """Global batch: micro-batch x accumulation x data-parallel ranks."""
        return self.micro_batch_size * self.gradient_accumulation_steps * self.data_parallel_size

    @property
    def key(self) -> str:
        """Canonical identity used for deduplication across a study."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    @property
    def label(self) -> str:
        """Short human label, e.g. ``z2 bf16 mb8x2 opt:cpu``."""
        parts = [
            f"z{self.zero_stage}",
            self.precision,
            f"mb{self.micro_batch_size}x{self.gradient_accumulation_steps}",
        ]
        if self.offload_optimizer != "none":
            parts.append(f"opt:{self.offload_optimizer}")
        if self.offload_param != "none":
            parts.append(f"param:{self.offload_param}")
        if self.activation_checkpointing:
            parts.append("ckpt")
        return " ".join(parts)

    def to_ds_config(
        self, base: dict[str, Any] | None = None, *, nvme_path: str | None = None
    ) -> dict[str, Any]:
        """The base config with this candidate's tuned keys laid over it."""
        config = copy.deepcopy(DEFAULT_BASE_CONFIG if base is None else base)
        config["train_batch_size"] = self.train_batch_size
        config["train_micro_batch_size_per_gpu"] = self.micro_batch_size
        config["gradient_accumulation_steps"] = self.gradient_accumulation_steps

        fp16 = dict(config.get("fp16") or {})
        bf16 = dict(config.get("bf16") or {})
        if self.precision == "fp16":
            fp16 = {**FP16_DYNAMIC_LOSS_SCALING, **fp16, "enabled": True}
        else:
            fp16 = {**fp16, "enabled": False}
        bf16 = {**bf16, "enabled": self.precision == "bf16"}
        config["fp16"], config["bf16"] = fp16, bf16

        zero = dict(config.get("zero_optimization") or {})
        zero["stage"] = self.zero_stage
        zero.pop("offload_optimizer", None)
        zero.pop("offload_param", None)
        if self.offload_optimizer != "none":
            zero["offload_optimizer"] = _offload_block(self.offload_optimizer, nvme_path)
        if self.offload_param != "none":
            zero["offload_param"] = _offload_block(self.offload_param, nvme_path)
        config["zero_optimization"] = zero
        return config


def _offload_block(device: str, nvme_path: str | None) -> dict[str, Any]:
    block: dict[str, Any] = {"device": device, "pin_memory": True}
    if device == "nvme":
        if not nvme_path:
            raise ValueError("nvme offload needs an nvme_path")
        block["nvme_path"] = nvme_path
    return block
