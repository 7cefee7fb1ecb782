"""A workload whose samples see each other within their micro-batch: attention over the
micro-batch, then BatchNorm. Its training depends on the micro-batch, and its cost grows
with the square of the micro-batch, so that splitting the global batch finer is faster: the
fastest configuration trains differently from its reference, for the tests of
``autotune run --verify strict``."""

from __future__ import annotations

import math
from typing import Any

from autotune.workloads import Workload

WIDTH = 256


def _mixing_model() -> Any:
    import torch

    class BatchMixing(torch.nn.Module):
        """softmax(h hᵀ / √d) h over the micro-batch's samples, BatchNorm, a linear head."""

        def __init__(self) -> None:
            super().__init__()
            self.inp = torch.nn.Linear(WIDTH, WIDTH)
            self.norm = torch.nn.BatchNorm1d(WIDTH)
            self.out = torch.nn.Linear(WIDTH, 1)

        def forward(self, inputs: Any) -> Any:
            hidden = self.inp(inputs)
            weights = torch.softmax(hidden @ hidden.T / math.sqrt(WIDTH), dim=-1)
            return self.out(torch.relu(self.norm(weights @ hidden)))

    return BatchMixing()


class BatchMixingWorkload(Workload):
    """A regression on fixed random data through :func:`_mixing_model`."""

    name = "batch-mixing"
    tokens_per_sample = 1
    default_global_batch = 2048

    def build_model(self) -> Any:
        return _mixing_model()

    def make_batch(self, micro_batch_size: int, device: Any) -> dict[str, Any]:
        import torch

        generator = torch.Generator().manual_seed(micro_batch_size)
        inputs = torch.randn(micro_batch_size, WIDTH, generator=generator)
        targets = torch.randn(micro_batch_size, 1, generator=generator)
        return {"inputs": inputs.to(device), "targets": targets.to(device)}

    def loss(self, model: Any, batch: Any) -> Any:
        import torch

        return torch.nn.functional.mse_loss(model(batch["inputs"]), batch["targets"])


def make() -> BatchMixingWorkload:
    return BatchMixingWorkload()
