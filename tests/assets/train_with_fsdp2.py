"""A user's own FSDP2 training script, as an exported ``launch.sh`` starts it: under
``accelerate launch --config_file accelerate_config.yaml`` it prepares the model with
``Accelerator()``, which applies the config; under torchrun with ``--fsdp2_config`` it calls
``fully_shard`` itself, as summary.md's lines show. The tests use it to prove that an FSDP2
export trains unedited; it prints what reached the model so that they can check it.
"""

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from transformers import GPT2Config, GPT2LMHeadModel

parser = argparse.ArgumentParser()
parser.add_argument("--fsdp2_config", help="set by launch.sh under torchrun")
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--micro-batch", type=int, default=4)
args = parser.parse_args()

model = GPT2LMHeadModel(
    GPT2Config(
        n_layer=2, n_embd=128, n_head=4, n_positions=64, vocab_size=4096, bos_token_id=0,
        eos_token_id=0,
    )
)  # fmt: skip
if args.fsdp2_config:
    dist.init_process_group("gloo")
    config = json.loads(Path(args.fsdp2_config).read_text())
    shard = config["fully_shard"]
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    policy = dict(
        reshard_after_forward=shard["reshard_after_forward"],
        mp_policy=MixedPrecisionPolicy(
            param_dtype=dtypes[shard["param_dtype"]], reduce_dtype=dtypes[shard["reduce_dtype"]]
        ),
        offload_policy=(
            CPUOffloadPolicy(pin_memory=False) if shard["cpu_offload"] else OffloadPolicy()
        ),
    )
    if shard["wrap"] == "block":
        for block in model.transformer.h:
            fully_shard(block, **policy)
    fully_shard(model, **{**policy, "reshard_after_forward": None})  # the root
    optimizer = torch.optim.AdamW(model.parameters(), **config["optimizer"]["params"])
    accumulation = config["gradient_accumulation_steps"]
    micro_batch = config["train_micro_batch_size_per_gpu"]
    sync_each = config["sync_each_micro_batch"]
    backward = torch.Tensor.backward
    rank = dist.get_rank()
else:
    from accelerate import Accelerator

    accelerator = Accelerator()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    accumulation = accelerator.gradient_accumulation_steps
    micro_batch = args.micro_batch
    backward = accelerator.backward
    rank = accelerator.process_index

tokens = torch.randint(0, 4096, (micro_batch, 64))
for _ in range(args.steps):
    for micro_step in range(accumulation):
        if args.fsdp2_config:  # as summary.md's lines say
            model.set_requires_gradient_sync(sync_each or micro_step == accumulation - 1)
        loss = model(input_ids=tokens, labels=tokens).loss
        backward(loss / accumulation)
    optimizer.step()
    optimizer.zero_grad()
assert torch.isfinite(loss.float()).item()
if rank == 0:
    state = model._get_fsdp_state()._fsdp_param_group
    units = sum(isinstance(m, FSDPModule) for m in model.modules())
    print(
        f"TRAINED fsdp2={isinstance(model, FSDPModule)} units={units} "
        f"param_dtype={state.mp_policy.param_dtype} offload={type(state.offload_policy).__name__} "
        f"loss={loss.item():.3f}",
        flush=True,
    )
dist.barrier()
dist.destroy_process_group()
