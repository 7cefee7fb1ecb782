"""A user's training script for the script-mode loss check: a tiny next-token model over
padded sequences of varying length, fed in a fixed order, its micro-batch read back from
the engine, its config from ``--deepspeed_config``.

How it trains comes from ``token_loss.json`` in its working folder (so that one study can
be checked under each), all optional:

- ``"normalise": "micro-batch"`` (default): each micro-batch's loss is the mean over its own
  real tokens, the normalisation the Hugging Face Trainer fixed in 2024: with accumulation
  the step weighs a micro-batch's tokens by how few there are. ``"step"``: the sum over the
  micro-batch's tokens divided by the whole step's, handed over with ``scale_wrt_gas=False``
  (the fix): the same loss and gradient whatever the split.
- ``"order": "seeded"`` (default): a permutation from a fixed seed. ``"clock"``: one seeded
  from the clock, so two runs do not see the same samples.
- ``"sleep_s"``: seconds to wait before ``deepspeed.initialize`` (a slow start).
"""

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()
settings_path = Path("token_loss.json")
settings = json.loads(settings_path.read_text()) if settings_path.exists() else {}

VOCAB, LENGTH, SAMPLES = 64, 12, 4096
data = torch.Generator().manual_seed(1234)
tokens = torch.randint(1, VOCAB, (SAMPLES, LENGTH), generator=data)
lengths = torch.randint(2, LENGTH + 1, (SAMPLES,), generator=data)
real = torch.arange(LENGTH)[None, :] < lengths[:, None]
input_ids = torch.where(real, tokens, 0)
labels = torch.where(real, tokens, -100)


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.mix = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(ids).cumsum(dim=1) / torch.arange(1, ids.shape[1] + 1)[None, :, None]
        return self.head(torch.tanh(self.mix(hidden)))


if settings.get("sleep_s"):
    time.sleep(float(settings["sleep_s"]))
model = TinyLM()
engine, *_ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
micro, accumulation = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
rank, world = dist.get_rank(), dist.get_world_size()
seed = time.time_ns() % 2**31 if settings.get("order") == "clock" else 0
order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(seed))
per_step = micro * accumulation * world
loss_function = torch.nn.CrossEntropyLoss(ignore_index=-100, reduction="sum")

for step in range(SAMPLES // per_step):
    samples = order[step * per_step : (step + 1) * per_step]
    step_tokens = int((labels[samples][:, 1:] != -100).sum())
    mine = samples[rank::world]  # this rank's share of the step, as a DistributedSampler
    for k in range(accumulation):
        batch = mine[k * micro : (k + 1) * micro]
        logits = engine(input_ids[batch])
        target = labels[batch][:, 1:]
        summed = loss_function(logits[:, :-1].reshape(-1, VOCAB), target.reshape(-1))
        if settings.get("normalise") == "step":
            # the gradient of the step's mean token loss: ranks' gradients are averaged
            engine.backward(summed * world / step_tokens, scale_wrt_gas=False)
        else:
            engine.backward(summed / (target != -100).sum())
        engine.step()
