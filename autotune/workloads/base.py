"""The Workload contract: what autotune needs to know about a model to probe it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class Workload(ABC):
    """A model, its synthetic batches and its loss.

    Implementations import torch (and their model library) inside methods, so that the
    registry stays importable by the CLI without them.
    """

    #: Registry name, also the default study name.
    name: str
    #: Tokens one sample carries (tokens/s = samples/s x this); 1 for a model without
    #: tokens (an image classifier, an MLP): it then reports samples/s only.
    tokens_per_sample: int = 1
    #: Samples per optimizer step when the user gives no --global-batch.
    default_global_batch: int

    @abstractmethod
    def build_model(self) -> torch.nn.Module:
        """A freshly initialised model (random weights; nothing downloaded).

        Called under ``torch.device("meta")`` for planning, so it must not touch data.
        """

    @abstractmethod
    def make_batch(self, micro_batch_size: int, device: torch.device) -> Any:
        """A synthetic batch of ``micro_batch_size`` samples on ``device``: a tensor, or a
        dict, list or tuple of them.

        Inputs must reach the model in the dtype the engine computes in (bf16 for a bf16
        candidate). Either take a third parameter ``dtype`` (``def make_batch(self,
        micro_batch_size, device, dtype=None)``): the probe passes the engine's dtype and
        the batch is yours to cast; or leave it out: the probe casts the batch's
        floating-point tensors to that dtype (integer tensors, e.g. token ids, stay)."""

    def import_model_code(self) -> None:
        """Import the library code :meth:`build_model` uses, building nothing and running
        no tensor operation: a CPU probe's launcher calls it once before it forks its ranks
        (:mod:`autotune.probe.fork_ranks`), so that no rank imports it again. Optional: by
        default each rank imports what it uses."""
        return

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The training loss of ``model`` on ``batch`` (model may be a DeepSpeed engine)."""
        return model(**batch).loss

    def shard_units(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The modules FSDP2 applies ``fully_shard`` to, one unit each, inner ones first,
        before the root: the transformer blocks (:func:`autotune.workloads.blocks.block_units`).
        A workload whose model calls a module of a block from outside that block's forward
        lists that module first, as a unit of its own."""
        from autotune.workloads.blocks import block_units

        return block_units(model)

    def checkpoint_blocks(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The blocks activation checkpointing recomputes one at a time, in forward order:
        by default the transformer blocks (:func:`autotune.workloads.blocks.block_units`).
        ``checkpoint_fraction`` counts its share of these."""
        from autotune.workloads.blocks import block_units

        return block_units(model)

    def enable_activation_checkpointing(
        self, model: torch.nn.Module, blocks: int | None = None, policy: str = "full"
    ) -> None:
        """Recompute activations during backward: of every block (``blocks`` None), or of
        the first ``blocks`` of :meth:`checkpoint_blocks`; every op again (``policy``
        ``full``) or selectively (``selective``: ``torch.utils.checkpoint``'s options from
        :func:`autotune.workloads.checkpointing.checkpoint_options`).
        :func:`autotune.workloads.checkpointing.checkpoint_leading_blocks` does both for any
        model. A workload that does not override this is probed without checkpointing
        (dropped from the space, with a note); one whose override takes no ``blocks`` is
        probed with all or none (a ``checkpoint_fraction`` between is dropped, with a note),
        one that takes no ``policy`` in full (``selective`` dropped, with a note)."""
        raise NotImplementedError(f"workload {self.name!r} does not support checkpointing")

    def active_params(self, model: torch.nn.Module) -> int:
        """Parameters each token computes with, for FLOPs (~6 per active parameter and token
        in training): every parameter of a dense model; a mixture of experts counts only the
        top-k experts a token is routed to. ``model`` is built on the meta device."""
        return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())

    def describe(self) -> str:
        return self.name

    def trace_fingerprint(self) -> dict[str, Any] | None:
        """What defines this model's shapes, as JSON data the same in every process (its
        config), or None where the workload cannot say: the memory model then keeps its
        activation traces for this process only (:mod:`autotune.memory._trace_cache`)."""
        return None
