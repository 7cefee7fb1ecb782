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
    #: Tokens one sample carries (tokens/s = samples/s x this).
    tokens_per_sample: int
    #: Samples per optimizer step when the user gives no --global-batch.
    default_global_batch: int

    @abstractmethod
    def build_model(self) -> torch.nn.Module:
        """A freshly initialised model (random weights; nothing downloaded).

        Called under ``torch.device("meta")`` for planning, so it must not touch data.
        """

    @abstractmethod
    def make_batch(self, micro_batch_size: int, device: torch.device) -> Any:
        """A synthetic batch of ``micro_batch_size`` samples on ``device``."""

    def loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The training loss of ``model`` on ``batch`` (model may be a DeepSpeed engine)."""
        return model(**batch).loss

    def enable_activation_checkpointing(self, model: torch.nn.Module) -> None:
        """Recompute every transformer block's activations during backward."""
        raise NotImplementedError(f"workload {self.name!r} does not support checkpointing")

    def describe(self) -> str:
        return self.name
