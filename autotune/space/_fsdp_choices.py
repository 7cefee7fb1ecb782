"""The FSDP2 part of a space: the ``fully_shard`` settings to search (:class:`FsdpChoices`),
what of them a machine and a world size keep (:func:`bind_fsdp`), and the define-by-run
decisions of an ``fsdp2`` candidate (:func:`decide_fsdp`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

from autotune.candidate import FsdpKnobs, FsdpWrap
from autotune.errors import SpaceError

Chooser = Callable[[str, Sequence[Any], str], Any]


class FsdpChoices(BaseModel):
    """The ``fully_shard`` settings an ``fsdp2`` candidate may take; the precision,
    micro-batch, accumulation and activation checkpointing are the space's own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reshard_after_forward: list[bool | PositiveInt] = Field(
        default=[True, False],
        description="true: free gathered parameters after forward (like ZeRO-3); false: "
        "keep them for backward (like ZeRO-2); N: reshard to groups of N ranks (hybrid, "
        "a divisor of the ranks).",
    )
    reduce_dtype: list[Literal["fp32", "bf16"]] = Field(
        default=["fp32"], description="Dtypes gradients are reduced in (MixedPrecisionPolicy)."
    )
    cpu_offload: list[bool] = Field(
        default=[False, True],
        description="CPUOffloadPolicy: parameters, gradients and the optimizer step on the host.",
    )
    wrap: list[FsdpWrap] = Field(
        default=["block"],
        description="Units fully_shard is applied to: block (each transformer block, then "
        "the root) or model (one unit).",
    )
    sync_each_micro_batch: list[bool] = Field(
        default=[False, True],
        description="With gradient accumulation: reduce the gradients on the last "
        "micro-batch only (false: unsharded gradients kept between micro-batches) or after "
        "each (true: only their shards kept, a reduce-scatter per micro-batch).",
    )

    @field_validator("*")
    @classmethod
    def _non_empty_unique(cls, values: list[Any]) -> list[Any]:
        if not values:
            raise ValueError("must list at least one value")
        keys = [(type(v), v) for v in values]
        if len(set(keys)) != len(keys):
            raise ValueError(f"lists a value twice: {values}")
        return values


def bind_fsdp(
    choices: FsdpChoices,
    precisions: Sequence[str],
    world_sizes: Sequence[int],
    notes: list[str],
) -> tuple[FsdpChoices, tuple[str, ...]]:
    """The FSDP2 settings and precisions usable here: fp16 is dropped (FSDP2 trains fp16
    only with a gradient scaler the training loop must add; bf16 needs none), and an int
    reshard size that does not divide every world size is dropped. SpaceError when
    nothing is left of a dimension."""
    kept_precisions = tuple(p for p in precisions if p != "fp16")
    if len(kept_precisions) < len(precisions):
        notes.append("fp16 dropped for fsdp2: it needs a gradient scaler; bf16 does not")
    if not kept_precisions:
        raise SpaceError(
            "backend fsdp2 lists no precision it trains here (fp16 needs a gradient "
            "scaler); add bf16 or fp32 to 'precision', or drop fsdp2 from 'backend'"
        )
    reshard: list[bool | int] = []
    for value in choices.reshard_after_forward:
        if isinstance(value, bool) or all(
            size % value == 0 and value < size for size in world_sizes
        ):
            reshard.append(value)
        else:
            notes.append(
                f"fsdp.reshard_after_forward {value} dropped: not a divisor below the "
                f"world size ({', '.join(map(str, world_sizes))} ranks)"
            )
    if not reshard:
        raise SpaceError(
            f"fsdp.reshard_after_forward lists {choices.reshard_after_forward}, none usable "
            f"at {', '.join(map(str, world_sizes))} ranks; add true or false"
        )
    return choices.model_copy(update={"reshard_after_forward": reshard}), kept_precisions


def decide_fsdp(choose: Chooser, choices: FsdpChoices) -> tuple[bool, FsdpKnobs]:
    """Whether the candidate offloads to CPU, and its ``fully_shard`` settings. A model
    sharded as one unit (``wrap: model``) is its root, which FSDP2 never reshards after
    forward: ``reshard_after_forward`` is asked only of per-block units."""
    cpu_offload = choose("fsdp.cpu_offload", choices.cpu_offload, "fsdp_cpu_offload")
    wrap = choose("fsdp.wrap", choices.wrap, "fsdp.wrap")
    reshard: bool | int = False
    if wrap == "block":
        reshard = choose(
            "fsdp.reshard_after_forward",
            choices.reshard_after_forward,
            "fsdp.reshard_after_forward",
        )
    reduce_dtype = choose("fsdp.reduce_dtype", choices.reduce_dtype, "fsdp.reduce_dtype")
    return cpu_offload, FsdpKnobs(
        reshard_after_forward=reshard, reduce_dtype=reduce_dtype, wrap=wrap
    )


def decide_sync(
    choose: Chooser, choices: FsdpChoices, knobs: FsdpKnobs, accumulation: int
) -> FsdpKnobs:
    """Whether gradients are reduced after each micro-batch: asked only where the candidate
    accumulates (with one micro-batch per step both are the same)."""
    if accumulation == 1:
        return knobs
    sync = choose(
        "fsdp.sync_each_micro_batch", choices.sync_each_micro_batch, "fsdp.sync_each_micro_batch"
    )
    return knobs.model_copy(update={"sync_each_micro_batch": sync})
