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


# DeepSpeed's offload_param.buffer_size default (elements): one NVMe swap buffer.
DEFAULT_PARAM_BUFFER_SIZE = 100_000_000
# Keys of an offload block that the candidate decides; a base config's other keys
# (pin_memory, buffer_count, buffer_size, max_in_cpu ...) are production tuning and kept.
_OFFLOAD_TUNED_KEYS = ("device", "nvme_path", "ratio")


# Fine ZeRO knobs and the stages whose DeepSpeed code reads them (runtime/zero/config.py;
# stage 0 reduces gradients with the engine's fixed-size buckets). Unset knobs keep the base
# config's value or DeepSpeed's default.
ZERO_KNOB_STAGES: dict[str, frozenset[int]] = {
    "overlap_comm": frozenset({1, 2, 3}),
    "contiguous_gradients": frozenset({1, 2, 3}),
    "reduce_bucket_size": frozenset({1, 2, 3}),
    "allgather_bucket_size": frozenset({1, 2}),
    "stage3_prefetch_bucket_size": frozenset({3}),
    "stage3_param_persistence_threshold": frozenset({3}),
    "stage3_max_live_parameters": frozenset({3}),
    "sub_group_size": frozenset({3}),
}
_KNOB_ABBREVIATIONS = {
    "overlap_comm": "overlap",
    "contiguous_gradients": "contig",
    "reduce_bucket_size": "rbs",
    "allgather_bucket_size": "abs",
    "stage3_prefetch_bucket_size": "pbs",
    "stage3_param_persistence_threshold": "persist",
    "stage3_max_live_parameters": "live",
    "sub_group_size": "subgrp",
}


class ZeroKnobs(BaseModel):
    """Values of the fine ZeRO knobs a candidate sets; None leaves the knob alone."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    overlap_comm: bool | None = Field(default=None, description="Overlap reduction and backward.")
    contiguous_gradients: bool | None = Field(
        default=None, description="Copy gradients into one buffer as they are produced."
    )
    reduce_bucket_size: PositiveInt | None = Field(
        default=None, description="Elements reduced at a time."
    )
    allgather_bucket_size: PositiveInt | None = Field(
        default=None, description="Elements all-gathered at a time (ZeRO 1-2)."
    )
    stage3_prefetch_bucket_size: PositiveInt | None = Field(
        default=None, description="Parameter elements prefetched ahead of use (ZeRO 3)."
    )
    stage3_param_persistence_threshold: PositiveInt | None = Field(
        default=None, description="Parameters smaller than this stay unpartitioned (ZeRO 3)."
    )
    stage3_max_live_parameters: PositiveInt | None = Field(
        default=None, description="Most parameter elements gathered at once (ZeRO 3)."
    )
    sub_group_size: PositiveInt | None = Field(
        default=None, description="Optimizer-step tile size in elements (ZeRO 3)."
    )

    def items(self) -> list[tuple[str, bool | int]]:
        return [(k, v) for k, v in self.model_dump().items() if v is not None]

    def label(self) -> str:
        parts = []
        for name, value in self.items():
            text = str(int(value)) if isinstance(value, bool) else f"{value:.0e}".replace("+0", "")
            parts.append(f"{_KNOB_ABBREVIATIONS[name]}={text}")
        return " ".join(parts)


class Candidate(BaseModel):
    """Frozen and hashable: the study never probes the same candidate twice (see ``key``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    precision: Precision = Field(description="Training precision: fp32, bf16 or fp16.")
    zero_stage: Literal[0, 1, 2, 3] = Field(description="ZeRO stage.")
    offload_optimizer: OffloadDevice = Field(
        default="none", description="Where optimizer states live (ZeRO 1-3)."
    )
    offload_optimizer_ratio: float = Field(
        default=1.0,
        gt=0.0,
        le=1.0,
        description="Share of optimizer states offloaded to CPU (< 1: partial, ZeRO 3 + cpu).",
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
    zero_knobs: ZeroKnobs = Field(
        default_factory=ZeroKnobs, description="Fine ZeRO knobs this candidate sets."
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
            ratio = f"@{self.offload_optimizer_ratio:g}" if self.offload_optimizer_ratio < 1 else ""
            parts.append(f"opt:{self.offload_optimizer}{ratio}")
        if self.offload_param != "none":
            parts.append(f"param:{self.offload_param}")
        if self.activation_checkpointing:
            parts.append("ckpt")
        knobs = self.zero_knobs.label()
        return " ".join([*parts, knobs] if knobs else parts)

    def to_ds_config(
        self,
        base: dict[str, Any] | None = None,
        *,
        nvme_path: str | None = None,
        largest_param_numel: int | None = None,
    ) -> dict[str, Any]:
        """The base config with this candidate's tuned keys laid over it.

        ``largest_param_numel``: elements of the model's largest parameter (an upper bound
        such as ``memory.largest_layer_params`` will do). With parameter offload to NVMe,
        ``offload_param.buffer_size`` is raised to at least that parameter's partition on
        one rank: DeepSpeed swaps each partition through one buffer and asserts it fits.
        """
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
        base_optimizer = zero.pop("offload_optimizer", None)
        base_param = zero.pop("offload_param", None)
        if self.offload_optimizer != "none":
            block = _offload_block(self.offload_optimizer, nvme_path, base_optimizer)
            if self.offload_optimizer_ratio < 1.0:
                block["ratio"] = self.offload_optimizer_ratio
            zero["offload_optimizer"] = block
        if self.offload_param != "none":
            block = _offload_block(self.offload_param, nvme_path, base_param)
            size = block.get("buffer_size", DEFAULT_PARAM_BUFFER_SIZE)
            numeric = isinstance(size, (int, float))  # a JSON base may write 1e8
            if self.offload_param == "nvme" and largest_param_numel and numeric:
                partition = -(-largest_param_numel // self.data_parallel_size)
                block["buffer_size"] = max(int(size), partition)
            zero["offload_param"] = block
        for name, value in self.zero_knobs.items():
            if self.zero_stage in ZERO_KNOB_STAGES[name]:
                zero[name] = value
        config["zero_optimization"] = zero
        return config


def _offload_block(device: str, nvme_path: str | None, base: Any = None) -> dict[str, Any]:
    kept = {k: v for k, v in (base or {}).items() if k not in _OFFLOAD_TUNED_KEYS}
    block: dict[str, Any] = {"pin_memory": True, **kept, "device": device}
    if device == "nvme":
        if not nvme_path:
            raise ValueError("nvme offload needs an nvme_path")
        block["nvme_path"] = nvme_path
    return block
