"""A `Workload` factory: the third way into autotune, for a model you can build in a
function (README, "Tune your own model").

    autotune run --workload examples/workload/mlp.py:make --gpus 2 --budget 5m

autotune builds the model itself, makes synthetic batches, and computes the loss, so it can
also trace the model's activations before any probe (`autotune plan` works on it). The
contract is `autotune.workloads.Workload`: `build_model`, `make_batch`, `loss` and a
`default_global_batch`. This one keeps to the minimum:

- no `tokens_per_sample` (an MLP has no tokens: autotune reports samples/s);
- no `enable_activation_checkpointing` (checkpointing is left out of the search, with a
  note);
- `make_batch` returns fp32 inputs and takes no `dtype`: the probe casts floating-point
  inputs to the engine's dtype (bf16 candidates), labels stay integers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from autotune.workloads import Workload

FEATURES = 512
CLASSES = 10


class MLPWorkload(Workload):
    """A 4-layer MLP classifier on random features (~0.8M parameters)."""

    name = "mlp"  # the study's default name
    default_global_batch = 64  # samples per optimizer step over all ranks

    def build_model(self) -> nn.Module:
        return nn.Sequential(
            nn.Linear(FEATURES, 1024), nn.GELU(),
            nn.Linear(1024, 512), nn.GELU(),
            nn.Linear(512, 256), nn.GELU(),
            nn.Linear(256, CLASSES),
        )  # fmt: skip

    def make_batch(self, micro_batch_size: int, device: torch.device) -> dict[str, Any]:
        generator = torch.Generator().manual_seed(micro_batch_size)
        features = torch.randn(micro_batch_size, FEATURES, generator=generator)
        labels = torch.randint(0, CLASSES, (micro_batch_size,), generator=generator)
        return {"features": features.to(device), "labels": labels.to(device)}

    def loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        logits = model(batch["features"])
        return nn.functional.cross_entropy(logits.float(), batch["labels"])


def make() -> Workload:
    return MLPWorkload()
