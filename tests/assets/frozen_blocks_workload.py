"""A workload whose training holds far less than its whole model: frozen linear blocks (no
gradients, no optimizer states) under a small trainable head. Sharded by FSDP2 over 2
ranks, a rank's training peak is about its half of the fp32 weights, so a whole fp32 copy
of the model on a rank (a build before sharding) would set its peak: the tests of FSDP2's
build read that off the probe's tracked peak."""

from __future__ import annotations

from typing import Any

from autotune.workloads import Workload

WIDTH = 512
BLOCKS = 16
# Parameters of the whole model: the blocks' weights and the head's weight and bias.
PARAMS = BLOCKS * WIDTH * WIDTH + WIDTH + 1


class FrozenBlocks(Workload):
    """``BLOCKS`` frozen bias-free ``Linear(WIDTH, WIDTH)`` + tanh, then a trainable
    ``Linear(WIDTH, 1)``: a regression on fixed random data."""

    name = "frozen-blocks"
    tokens_per_sample = 1
    default_global_batch = 8

    def build_model(self) -> Any:
        import torch

        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.blocks = torch.nn.ModuleList(
                    torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(BLOCKS)
                )
                self.head = torch.nn.Linear(WIDTH, 1)
                self.blocks.requires_grad_(False)

            def forward(self, inputs: Any) -> Any:
                for block in self.blocks:
                    inputs = torch.tanh(block(inputs))
                return self.head(inputs)

        return Model()

    def make_batch(self, micro_batch_size: int, device: Any) -> dict[str, Any]:
        import torch

        generator = torch.Generator().manual_seed(micro_batch_size)
        inputs = torch.randn(micro_batch_size, WIDTH, generator=generator)
        targets = torch.randn(micro_batch_size, 1, generator=generator)
        return {"inputs": inputs.to(device), "targets": targets.to(device)}

    def loss(self, model: Any, batch: Any) -> Any:
        import torch

        return torch.nn.functional.mse_loss(model(batch["inputs"]), batch["targets"])


def make() -> FrozenBlocks:
    return FrozenBlocks()
