"""The vocabulary in which a backend states its memory terms: what it is told of the model
(:class:`ModelFacts`, :class:`ActivationProfile`, which the memory model measures) and
what it answers (:class:`Breakdown`, bytes of one memory of one rank by what holds them),
which the memory model adds up."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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


class ModelFacts(BaseModel):
    """What the memory model needs to know of a workload's parameters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    params: int = Field(description="Unique parameters (tied weights once).")
    largest_param: int = Field(description="Elements of the largest parameter tensor.")
    small_params: int = Field(description="Elements in tensors under the persistence threshold.")
    active_params: int = Field(
        default=0,
        description="Parameters each token computes with (an MoE's top-k experts, not all; "
        "a DiT's without its per-sample conditioning): compute and cost, not model states; "
        "0 when unknown (then all).",
    )
    block_params: int = Field(
        default=0, description="Parameters in the transformer blocks (FSDP2's units)."
    )
    largest_block_params: int = Field(
        default=0, description="Parameters of the largest transformer block."
    )


class ActivationProfile(BaseModel):
    """Bytes beyond the parameters during one micro-batch's forward and backward."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    forward_peak_bytes: float
    backward_peak_bytes: float
    at_first_grad_bytes: float
    in_blocks_backward_peak_bytes: float = Field(
        description="The backward peak (counted as backward_peak_bytes is) before every "
        "block (the workload's shard units) has its gradients: backward's start and the "
        "blocks' backward, not what runs after the blocks (a GPT's embeddings); the whole "
        "backward's peak where a block parameter gets no gradient or there are no blocks."
    )
    after_blocks_backward_peak_bytes: float = Field(
        description="The most backward holds once every block (the workload's shard units) "
        "has its gradients: what runs before the blocks in forward (a GPT's embeddings), "
        "with the gradients of the parameters outside the blocks held and the blocks' "
        "dropped; the whole backward's peak so counted where a block parameter gets no "
        "gradient or there are no blocks."
    )
    offloaded_bytes: float = Field(
        default=0.0,
        description="Host bytes at most holding the saved activations offloaded from the "
        "device (activation_offload cpu), as pinned memory holds them; the device's bytes "
        "above are without them.",
    )
    offload_transfer_bytes: float = Field(
        default=0.0,
        description="Bytes the offload copies to the host in one micro-batch's forward (and "
        "back in its backward): what crosses the host link.",
    )
