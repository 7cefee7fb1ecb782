"""A Hugging Face Trainer script with DeepSpeed: a tiny GPT-2, randomly initialised (nothing
downloaded), trained on synthetic token sequences.

    torchrun --nproc-per-node 2 train.py --deepspeed ds_config.json --output_dir out \\
        --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --max_steps 20

autotune tunes it unedited (README, "Tune your own model"):

    autotune run --script train.py --gpus 2 --budget 5m -- --deepspeed ds_config.json \\
        --output_dir out --per_device_train_batch_size 4 --gradient_accumulation_steps 2
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # CPU ranks where there is no GPU
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
)

SEQUENCE = 64
VOCAB = 4096


class SyntheticTokens(torch.utils.data.Dataset):
    """Random token sequences; labels are the inputs (causal language modelling)."""

    def __init__(self, samples: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, VOCAB, (samples, SEQUENCE), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


def main() -> None:
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    config = GPT2Config(
        n_layer=2, n_embd=128, n_head=4, n_positions=SEQUENCE, vocab_size=VOCAB,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    trainer = Trainer(model=model, args=args, train_dataset=SyntheticTokens(4096))
    trainer.train()


if __name__ == "__main__":
    main()
