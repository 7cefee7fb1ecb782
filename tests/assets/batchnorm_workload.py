"""A workload whose model normalises over the batch (BatchNorm): its training depends on the
micro-batch, for the tests of ``autotune verify``."""

from __future__ import annotations

from typing import Any

from autotune.workloads import Workload

WIDTH = 32


class BatchNormMLP(Workload):
    """Linear, BatchNorm1d, ReLU, Linear: a regression on fixed random data."""

    name = "batchnorm-mlp"
    tokens_per_sample = 1
    default_global_batch = 8

    def build_model(self) -> Any:
        import torch

        return torch.nn.Sequential(
            torch.nn.Linear(WIDTH, WIDTH),
            torch.nn.BatchNorm1d(WIDTH),
            torch.nn.ReLU(),
            torch.nn.Linear(WIDTH, 1),
        )

    def make_batch(self, micro_batch_size: int, device: Any) -> dict[str, Any]:
        import torch

        generator = torch.Generator().manual_seed(micro_batch_size)
        inputs = torch.randn(micro_batch_size, WIDTH, generator=generator)
        targets = torch.randn(micro_batch_size, 1, generator=generator)
        return {"inputs": inputs.to(device), "targets": targets.to(device)}

    def loss(self, model: Any, batch: Any) -> Any:
        import torch

        return torch.nn.functional.mse_loss(model(batch["inputs"]), batch["targets"])


def make() -> BatchNormMLP:
    return BatchNormMLP()
