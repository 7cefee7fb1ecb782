"""Bytes of one memory of one rank, by what holds them: the vocabulary in which a backend
states its memory terms and the memory model adds them up."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Breakdown(BaseModel):
    """Bytes of one memory (device or host) of one rank, by what holds them."""

    model_config = ConfigDict(extra="forbid")

    params: float = 0.0
    grads: float = 0.0
    optimizer_states: float = 0.0
    activations: float = 0.0
    buckets: float = 0.0
    workspace: float = 0.0

    @property
    def total(self) -> float:
        return (
            self.params
            + self.grads
            + self.optimizer_states
            + self.activations
            + self.buckets
            + self.workspace
        )

    def plus(self, other: Breakdown) -> Breakdown:
        return Breakdown(
            **{k: getattr(self, k) + getattr(other, k) for k in Breakdown.model_fields}
        )
