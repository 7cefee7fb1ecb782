"""One concrete point of the search space: a plain frozen record.

A training backend renders it as its own config (for DeepSpeed,
:func:`autotune.backends.deepspeed.render_ds_config`, the only code that spells DeepSpeed's
JSON keys), so that the probe, the memory model and the export all render the same config.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

Precision = Literal["fp32", "bf16", "fp16"]
OffloadDevice = Literal["none", "cpu", "nvme"]
# The training libraries a candidate can train with (autotune.backends registers them).
BackendName = Literal["deepspeed", "fsdp2"]
# In the blocks recomputed: every op again (full), or the matmul and attention outputs kept
# and the cheap ops between them recomputed (selective: torch's
# create_selective_checkpoint_contexts, as torchtitan's op-level policy).
CheckpointPolicy = Literal["full", "selective"]
# Where the saved activations of the blocks that are not recomputed live between forward and
# backward: on the device (none), or in host memory, moved there by saved-tensor hooks
# (cpu: :mod:`autotune.workloads.activation_offload`).
ActivationOffload = Literal["none", "cpu"]
# FSDP2's unit of sharding: each transformer block and the root (torchtitan's default),
# or the whole model as one unit.
FsdpWrap = Literal["block", "model"]

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


class FsdpKnobs(BaseModel):
    """How a candidate of the ``fsdp2`` backend calls ``fully_shard``
    (torch.distributed.fsdp; the precision's dtype is ``MixedPrecisionPolicy.param_dtype``,
    offloading to CPU is ``CPUOffloadPolicy``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reshard_after_forward: bool | PositiveInt = Field(
        default=True,
        description="Free each unit's gathered parameters after its forward (True, like "
        "ZeRO-3), keep them until backward (False, like ZeRO-2), or reshard to groups of "
        "this many ranks (an int: hybrid sharding).",
    )
    reduce_dtype: Literal["fp32", "bf16"] = Field(
        default="fp32",
        description="MixedPrecisionPolicy.reduce_dtype: the dtype gradients are reduced in.",
    )
    wrap: FsdpWrap = Field(
        default="block",
        description="The unit fully_shard is applied to: each transformer block then the "
        "root, or the whole model at once.",
    )
    sync_each_micro_batch: bool = Field(
        default=False,
        description="With gradient accumulation: reduce-scatter the gradients after every "
        "micro-batch and accumulate the shards (True: 1/N of the gradient memory, a "
        "reduce-scatter per micro-batch, as ZeRO-2/3 accumulate), or accumulate unsharded "
        "gradients and reduce on the last micro-batch only (False: "
        "set_requires_gradient_sync, accelerate's default).",
    )

    def label(self) -> str:
        reshard = self.reshard_after_forward
        parts = [f"reshard:{'yes' if reshard is True else 'no' if reshard is False else reshard}"]
        if self.reduce_dtype != "fp32":
            parts.append(f"reduce:{self.reduce_dtype}")
        if self.wrap != "block":
            parts.append(f"wrap:{self.wrap}")
        if self.sync_each_micro_batch:
            parts.append("sync:each")
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
    checkpoint_fraction: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Share of the model's blocks whose activations are recomputed in "
        "backward, the first ones in forward order (0: none, 1: every block). Stored as "
        "``activation_checkpointing`` (false or true) where it is 0 or 1, the spelling of "
        "the all-or-nothing switch that studies stored before the fraction existed.",
    )
    checkpoint_policy: CheckpointPolicy = Field(
        default="full",
        description="In the blocks recomputed: every op again (full), or the matmul and "
        "attention outputs kept and the cheap ops recomputed (selective). Left out of the "
        "stored record where full.",
    )
    activation_offload: ActivationOffload = Field(
        default="none",
        description="Where the blocks that are not recomputed keep their saved activations "
        "between forward and backward: on the device (none), or in host memory (cpu). Left "
        "out of the stored record where none.",
    )
    zero_knobs: ZeroKnobs = Field(
        default_factory=ZeroKnobs, description="Fine ZeRO knobs this candidate sets."
    )
    backend: BackendName = Field(
        default="deepspeed", description="The training library: deepspeed or fsdp2."
    )
    fsdp: FsdpKnobs | None = Field(
        default=None, description="How fully_shard is called (the fsdp2 backend only)."
    )

    @model_validator(mode="before")
    @classmethod
    def _checkpointing_switch(cls, values: Any) -> Any:
        """``activation_checkpointing: true`` (the switch) is ``checkpoint_fraction: 1``."""
        if isinstance(values, dict) and "activation_checkpointing" in values:
            values = dict(values)
            switch = values.pop("activation_checkpointing")
            if "checkpoint_fraction" in values:
                raise ValueError("give activation_checkpointing or checkpoint_fraction, not both")
            values["checkpoint_fraction"] = 1.0 if switch else 0.0
        return values

    @model_serializer(mode="wrap")
    def _stored(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """All or none of the blocks recomputed is stored as the switch
        ``activation_checkpointing``, in the field's place: records, keys and tables of
        studies that never search a fraction read as they did before it existed."""
        values = handler(self)
        if values.get("checkpoint_policy") == "full":
            del values["checkpoint_policy"]
        if values.get("activation_offload") == "none":
            del values["activation_offload"]
        fraction = values.get("checkpoint_fraction")
        if fraction not in (0.0, 1.0):
            return values
        return {
            ("activation_checkpointing" if name == "checkpoint_fraction" else name): (
                bool(value) if name == "checkpoint_fraction" else value
            )
            for name, value in values.items()
        }

    @model_validator(mode="after")
    def _policy_of_recomputed_blocks(self) -> Candidate:
        if self.checkpoint_policy != "full" and not self.activation_checkpointing:
            raise ValueError("a checkpoint_policy applies where some block is recomputed")
        if self.activation_offload != "none" and self.checkpoint_fraction >= 1:
            raise ValueError(
                "an activation_offload applies where some block is not recomputed "
                "(checkpoint_fraction below 1): a recomputed block saves no activations to move"
            )
        return self

    @model_validator(mode="after")
    def _backend_fields(self) -> Candidate:
        """An fsdp2 candidate states its sharding in ``fsdp``: FSDP2 shards parameters,
        gradients and optimizer states as ZeRO-3 does (``zero_stage`` 3, no ZeRO knobs),
        and ``CPUOffloadPolicy`` moves all three to the host together."""
        if self.backend == "deepspeed":
            if self.fsdp is not None:
                raise ValueError("fsdp knobs apply to backend fsdp2 only")
            return self
        if self.zero_stage != 3 or self.zero_knobs.items():
            raise ValueError("an fsdp2 candidate shards as ZeRO-3: zero_stage 3, no zero_knobs")
        offload = {self.offload_optimizer, self.offload_param}
        if len(offload) != 1 or offload - {"none", "cpu"} or self.offload_optimizer_ratio < 1:
            raise ValueError(
                "fsdp2 offloads parameters, gradients and optimizer states to CPU together "
                "(CPUOffloadPolicy): offload_optimizer and offload_param both none or both cpu"
            )
        if self.fsdp is None:
            object.__setattr__(self, "fsdp", FsdpKnobs())
        elif self.fsdp.sync_each_micro_batch and self.gradient_accumulation_steps == 1:
            raise ValueError("fsdp sync_each_micro_batch applies with gradient accumulation only")
        return self

    @property
    def train_batch_size(self) -> int:
        """Global batch: micro-batch x accumulation x data-parallel ranks."""
        return self.micro_batch_size * self.gradient_accumulation_steps * self.data_parallel_size

    @property
    def activation_checkpointing(self) -> bool:
        """Some block's activations are recomputed in backward."""
        return self.checkpoint_fraction > 0

    @property
    def checkpoint_label(self) -> str:
        """``ckpt`` (every block recomputed), ``ckpt:0.5`` (half of them), ``:sel`` after
        either with the selective policy, or "" (none)."""
        if not self.activation_checkpointing:
            return ""
        label = "ckpt" if self.checkpoint_fraction == 1 else f"ckpt:{self.checkpoint_fraction:.2g}"
        return label + (":sel" if self.checkpoint_policy == "selective" else "")

    @property
    def activations_label(self) -> str:
        """``act:cpu`` where the kept blocks' saved activations go to host memory (as
        ``opt:cpu`` and ``param:cpu`` name the optimizer's and the parameters'), else ""."""
        return f"act:{self.activation_offload}" if self.activation_offload != "none" else ""

    @property
    def fsdp_cpu_offload(self) -> bool:
        """An fsdp2 candidate's ``CPUOffloadPolicy``: parameters, gradients and the
        optimizer step on the host."""
        return self.fsdp is not None and self.offload_param == "cpu"

    @property
    def moving_parts(self) -> tuple[float, ...]:
        """Where the candidate stands in the simplicity order, lower simpler, compared in
        this order (docs/architecture.md, "The simplicity order"): how far it offloads
        (none, cpu, nvme; the farther of optimizer and parameters), whether parameters are
        offloaded too, the share of blocks recomputed, the ZeRO stage, the accumulation steps,
        the fine ZeRO knobs it sets, a selective recomputation policy, activations offloaded
        to the host. Each adds host memory, traffic or code paths that can fail in
        production."""
        reach = {"none": 0, "cpu": 1, "nvme": 2}
        return (
            max(reach[self.offload_optimizer], reach[self.offload_param]),
            reach[self.offload_param],
            # all or none stays an int: the order stored studies' rounds recorded
            int(self.checkpoint_fraction)
            if self.checkpoint_fraction in (0, 1)
            else self.checkpoint_fraction,
            self.zero_stage,
            self.gradient_accumulation_steps,
            len(self.zero_knobs.items()),
            int(self.checkpoint_policy == "selective"),
            int(self.activation_offload != "none"),
        )

    @property
    def key(self) -> str:
        """Canonical identity used for deduplication across a study. A DeepSpeed candidate
        leaves out the backend fields, so that its key is the one studies stored before
        there was a second backend."""
        values = self.model_dump(mode="json")
        if self.backend == "deepspeed":
            del values["backend"], values["fsdp"]
        return json.dumps(values, sort_keys=True)

    def dimension_values(self) -> dict[str, Any]:
        """The value this candidate takes in each dimension of a space, by the space file's
        name (``zero.<knob>``, ``fsdp.<setting>``). An fsdp2 candidate takes no ZeRO stage,
        offload target or ratio of its own: its offload is ``fsdp.cpu_offload``."""
        values = self.model_dump(mode="json", exclude={"zero_knobs", "fsdp"})
        values.update({f"zero.{name}": value for name, value in self.zero_knobs.items()})
        if self.fsdp is not None:
            for name in (
                "zero_stage",
                "offload_optimizer",
                "offload_optimizer_ratio",
                "offload_param",
            ):
                del values[name]
            values["fsdp.cpu_offload"] = self.fsdp_cpu_offload
            values.update({f"fsdp.{k}": v for k, v in self.fsdp.model_dump(mode="json").items()})
        return values

    @property
    def label(self) -> str:
        """Short human label, e.g. ``z2 bf16 mb8x2 opt:cpu`` or ``fsdp2 bf16 mb8x1
        reshard:no cpu``."""
        split = f"mb{self.micro_batch_size}x{self.gradient_accumulation_steps}"
        if self.fsdp is not None:
            offload = ["cpu"] if self.offload_param == "cpu" else []
            ckpt = [self.checkpoint_label] if self.activation_checkpointing else []
            act = [self.activations_label] if self.activations_label else []
            return " ".join(
                ["fsdp2", self.precision, split, self.fsdp.label(), *offload, *ckpt, *act]
            )
        parts = [f"z{self.zero_stage}", self.precision, split]
        if self.offload_optimizer != "none":
            ratio = f"@{self.offload_optimizer_ratio:g}" if self.offload_optimizer_ratio < 1 else ""
            parts.append(f"opt:{self.offload_optimizer}{ratio}")
        if self.offload_param != "none":
            parts.append(f"param:{self.offload_param}")
        if self.activation_checkpointing:
            parts.append(self.checkpoint_label)
        if self.activations_label:
            parts.append(self.activations_label)
        knobs = self.zero_knobs.label()
        return " ".join([*parts, knobs] if knobs else parts)


def simpler_because(simpler: tuple[float, ...], other: tuple[float, ...]) -> str:
    """Why a candidate with ``simpler`` moving parts (:attr:`Candidate.moving_parts`) is
    simpler than one with ``other``, from the first place where they differ; "" when it is
    not simpler."""
    pairs = enumerate(zip(simpler, other, strict=True))
    places = [i for i, (mine, theirs) in pairs if mine != theirs]
    if not places or simpler[places[0]] > other[places[0]]:
        return ""
    place, mine, theirs = places[0], simpler[places[0]], other[places[0]]
    return (
        "no offload" if mine == 0 else "offloads to CPU, not NVMe",
        "parameters stay on the device",
        "no activation checkpointing" if mine == 0 else "fewer blocks recomputed",
        f"ZeRO-{mine}, not ZeRO-{theirs}",
        f"{mine} accumulation step{'s' * (mine != 1)}, not {theirs}",
        "fewer fine ZeRO knobs",
        "recomputes its blocks in full, without a selective policy",
        "activations kept on the device",
    )[place]
