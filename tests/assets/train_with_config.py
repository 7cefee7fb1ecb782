"""A user's own training script: it only hands the exported file to deepspeed.initialize.

Run with torchrun or the deepspeed launcher; the tests use it to prove that an exported
ds_config.json works unedited.

DeepSpeed runs unmodified; only its JIT-compiled ops come from autotune's op folder, built
without debug information (the same machine code: see autotune.backends.deepspeed.ops), so that the
suite
compiles each op once instead of again with DeepSpeed's ``-g``.
"""

import argparse

import deepspeed
import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel

from autotune.backends.deepspeed.ops import guard_op_loads

parser = argparse.ArgumentParser()
parser.add_argument("--config", "--deepspeed_config", dest="config", required=True)
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
args = parser.parse_args()
guard_op_loads()

model = GPT2LMHeadModel(
    GPT2Config(
        n_layer=2,
        n_embd=128,
        n_head=4,
        n_positions=64,
        vocab_size=4096,
        bos_token_id=0,
        eos_token_id=0,
    )
)
engine, _, _, _ = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), config=args.config
)
tokens = torch.randint(0, 4096, (engine.train_micro_batch_size_per_gpu(), 64))
for _ in range(args.steps * engine.gradient_accumulation_steps()):
    loss = engine(input_ids=tokens.to(engine.device), labels=tokens.to(engine.device)).loss
    engine.backward(loss)
    engine.step()
assert torch.isfinite(loss.float()).item()
if dist.get_rank() == 0:
    print(f"TRAINED global_steps={engine.global_steps} loss={loss.item():.3f}", flush=True)
dist.barrier()
dist.destroy_process_group()
