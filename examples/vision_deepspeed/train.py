"""A plain DeepSpeed training script: a small convolutional network on synthetic 32x32
images (nothing downloaded).

    deepspeed --num_gpus 2 train.py --deepspeed --deepspeed_config ds_config.json
    torchrun --nproc-per-node 2 train.py --deepspeed --deepspeed_config ds_config.json

autotune tunes it unedited (README, "Tune your own model"):

    autotune run --script train.py --gpus 2 --budget 5m -- \\
        --deepspeed --deepspeed_config ds_config.json

It reads its micro-batch back from the engine and casts its images to the engine's dtype,
so every configuration autotune hands it trains as configured.
"""

from __future__ import annotations

import argparse
import os

import torch

if not torch.cuda.is_available():  # CPU ranks where there is no GPU
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
from torch import nn


class SmallConvNet(nn.Module):
    """Three convolutional blocks and a linear classifier (~0.3M parameters)."""

    def __init__(self, classes: int = 10, width: int = 32) -> None:
        super().__init__()

        def block(inputs: int, outputs: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(inputs, outputs, 3, padding=1),
                nn.GroupNorm(8, outputs),  # no running statistics: trains in bf16 too
                nn.ReLU(),
                nn.Conv2d(outputs, outputs, 3, padding=1),
                nn.ReLU(),
                nn.MaxPool2d(2),
            )

        self.features = nn.Sequential(
            block(3, width), block(width, 2 * width), block(2 * width, 4 * width)
        )
        self.classifier = nn.Linear(4 * width * 4 * 4, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images).flatten(1))


def synthetic_images(samples: int, classes: int = 10) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(samples, 3, 32, 32, generator=generator)
    labels = torch.randint(0, classes, (samples,), generator=generator)
    return torch.utils.data.TensorDataset(images, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher's
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = SmallConvNet()
    dataset = synthetic_images(args.samples)
    engine, _, loader, _ = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), training_data=dataset
    )
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
    dtype = torch.float16 if engine.fp16_enabled() else dtype
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        for images, labels in loader:
            logits = engine(images.to(engine.device, dtype))
            loss = loss_fn(logits.float(), labels.to(engine.device))
            engine.backward(loss)
            engine.step()
        if engine.global_rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
