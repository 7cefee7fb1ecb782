"""A candidate as an FSDP2 config (:class:`Fsdp2Config`): the one record the probe's rank
builds ``fully_shard`` from, the export writes (``fsdp2_config.json``) and the accelerate
config is drawn from. Its keys are autotune's; the ``fully_shard`` arguments they become are
spelled in :mod:`._engine`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError

from autotune.errors import ExportError

if TYPE_CHECKING:
    from autotune.candidate import Candidate

Dtype = Literal["fp32", "bf16", "fp16"]

# The optimizer when the user gives no base config (DeepSpeed's default base config's).
DEFAULT_OPTIMIZER: dict[str, Any] = {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}}
# Optimizers of a base config's ``optimizer.type`` that torch.optim has, by their torch name.
TORCH_OPTIMIZERS = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}


class FullyShard(BaseModel):
    """How ``fully_shard`` is applied (torch.distributed.fsdp)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reshard_after_forward: bool | PositiveInt = Field(
        description="Free gathered parameters after forward (true), keep them for backward "
        "(false), or reshard to groups of this many ranks."
    )
    param_dtype: Dtype = Field(description="MixedPrecisionPolicy.param_dtype: compute dtype.")
    reduce_dtype: Dtype = Field(description="MixedPrecisionPolicy.reduce_dtype.")
    cpu_offload: bool = Field(description="CPUOffloadPolicy: shards and optimizer on the host.")
    wrap: Literal["block", "model"] = Field(
        description="Units: each transformer block then the root, or the root alone."
    )


class Fsdp2Config(BaseModel):
    """What an fsdp2 candidate trains with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: Literal["fsdp2"] = "fsdp2"
    train_batch_size: PositiveInt = Field(description="Global batch per optimizer step.")
    train_micro_batch_size_per_gpu: PositiveInt = Field(description="Samples per forward.")
    gradient_accumulation_steps: PositiveInt = Field(
        description="Micro-batches per optimizer step."
    )
    sync_each_micro_batch: bool = Field(
        default=False,
        description="Reduce-scatter gradients after every micro-batch and accumulate their "
        "shards; false: accumulate unsharded gradients, reduce on the last micro-batch.",
    )
    activation_checkpointing: bool = Field(description="Recompute blocks in backward.")
    checkpoint_fraction: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description="The share of the blocks recomputed, the first ones; absent: every "
        "block (activation_checkpointing true) or none.",
    )
    checkpoint_policy: Literal["selective"] | None = Field(
        default=None,
        description="selective: recomputed blocks keep their matmul and attention outputs "
        "(torch's create_selective_checkpoint_contexts); absent: they recompute every op.",
    )
    activation_offload: Literal["cpu"] | None = Field(
        default=None,
        description="cpu: the blocks that are not recomputed keep their saved activations "
        "in host memory (saved-tensor hooks, autotune.workloads.activation_offload); "
        "absent: on the device.",
    )
    fully_shard: FullyShard
    optimizer: dict[str, Any] = Field(
        description="The optimizer, as a DeepSpeed config states it: type and params."
    )
    gradient_clipping: float = Field(
        default=0.0, ge=0.0, description="Max gradient norm before each step; 0: none."
    )


def render_fsdp2_config(
    candidate: Candidate,
    base: dict[str, Any] | None = None,
    *,
    nvme_path: str | None = None,
    largest_param_numel: int | None = None,
) -> dict[str, Any]:
    """The candidate as an FSDP2 config; the optimizer and gradient clipping are the base
    config's (a DeepSpeed config's ``optimizer`` block and ``gradient_clipping``), else
    AdamW as DeepSpeed's default base has it and no clipping.
    ``nvme_path`` and ``largest_param_numel`` size DeepSpeed's buffers: unused here."""
    del nvme_path, largest_param_numel
    assert candidate.fsdp is not None, "an fsdp2 candidate carries its fsdp knobs"
    optimizer = dict((base or {}).get("optimizer") or DEFAULT_OPTIMIZER)
    config = Fsdp2Config(
        train_batch_size=candidate.train_batch_size,
        train_micro_batch_size_per_gpu=candidate.micro_batch_size,
        gradient_accumulation_steps=candidate.gradient_accumulation_steps,
        sync_each_micro_batch=candidate.fsdp.sync_each_micro_batch,
        activation_checkpointing=candidate.activation_checkpointing,
        checkpoint_fraction=(
            candidate.checkpoint_fraction if 0 < candidate.checkpoint_fraction < 1 else None
        ),
        checkpoint_policy="selective" if candidate.checkpoint_policy == "selective" else None,
        activation_offload="cpu" if candidate.activation_offload == "cpu" else None,
        fully_shard=FullyShard(
            reshard_after_forward=candidate.fsdp.reshard_after_forward,
            param_dtype=candidate.precision,
            reduce_dtype="fp32" if candidate.precision == "fp32" else candidate.fsdp.reduce_dtype,
            cpu_offload=candidate.fsdp_cpu_offload,
            wrap=candidate.fsdp.wrap,
        ),
        optimizer=optimizer,
        gradient_clipping=float((base or {}).get("gradient_clipping") or 0.0),
    )
    # all or none of the blocks, in full, activations on the device: the config as written
    # before any of these was tuned
    unset = {
        name
        for name in ("checkpoint_fraction", "checkpoint_policy", "activation_offload")
        if getattr(config, name) is None
    }
    return config.model_dump(mode="json", exclude=unset or None)


def validate_fsdp2_config(
    config: dict[str, Any], world_size: int, accelerator: str = "cpu"
) -> None:
    """Check an exported FSDP2 config: its schema, the batch arithmetic for ``world_size``
    ranks, and an optimizer torch has; ExportError (one line) if it fails."""
    del accelerator
    try:
        parsed = Fsdp2Config.model_validate(config)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise ExportError(f"the FSDP2 config is invalid: {where}: {error['msg']}") from None
    product = (
        parsed.train_micro_batch_size_per_gpu * parsed.gradient_accumulation_steps * world_size
    )
    if product != parsed.train_batch_size:
        raise ExportError(
            f"the FSDP2 config's train_batch_size {parsed.train_batch_size} is not micro-batch "
            f"x accumulation x {world_size} ranks ({product})"
        )
    optimizer_class(parsed.optimizer)


def optimizer_class(optimizer: dict[str, Any]) -> str:
    """The torch.optim class name of a DeepSpeed-style ``optimizer`` block."""
    kind = str(optimizer.get("type", "")).lower()
    if kind not in TORCH_OPTIMIZERS:
        raise ExportError(
            f"optimizer type {optimizer.get('type')!r} has no torch.optim class for FSDP2; "
            f"use one of {', '.join(TORCH_OPTIMIZERS.values())} in the base config"
        )
    return TORCH_OPTIMIZERS[kind]
