"""The fine ZeRO knobs a space searches (:class:`ZeroKnobChoices`), and the check every list
of a space passes (:func:`non_empty_unique`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator


def non_empty_unique(values: list[Any] | None) -> list[Any] | None:
    if values is None:
        return None
    if not values:
        raise ValueError("must list at least one value")
    if len(set(values)) != len(values):
        raise ValueError(f"lists a value twice: {values}")
    return values


class ZeroKnobChoices(BaseModel):
    """Fine ZeRO knobs to search; an absent knob keeps DeepSpeed's (or the base's) value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    overlap_comm: list[bool] | None = Field(default=None, description="ZeRO 1-3.")
    contiguous_gradients: list[bool] | None = Field(default=None, description="ZeRO 1-3.")
    reduce_bucket_size: list[PositiveInt] | None = Field(
        default=None, description="Elements, ZeRO 1-3."
    )
    allgather_bucket_size: list[PositiveInt] | None = Field(
        default=None, description="Elements, ZeRO 1-2."
    )
    stage3_prefetch_bucket_size: list[PositiveInt] | None = Field(
        default=None, description="Elements, ZeRO 3."
    )
    stage3_param_persistence_threshold: list[PositiveInt] | None = Field(
        default=None, description="Elements, ZeRO 3."
    )
    stage3_max_live_parameters: list[PositiveInt] | None = Field(
        default=None, description="Elements, ZeRO 3."
    )
    sub_group_size: list[PositiveInt] | None = Field(default=None, description="Elements, ZeRO 3.")

    @field_validator("*", mode="after")
    @classmethod
    def _non_empty(cls, values: list[Any] | None) -> list[Any] | None:
        return non_empty_unique(values)

    @field_validator("*", mode="before")
    @classmethod
    def _floats_to_ints(cls, values: Any) -> Any:
        # YAML reads 5.0e+8 as a float; bucket sizes are element counts.
        if isinstance(values, list):
            return [int(v) if isinstance(v, float) and v.is_integer() else v for v in values]
        return values

    def items(self) -> list[tuple[str, list[Any]]]:
        return [(k, v) for k, v in self.model_dump().items() if v is not None]
