"""A user's training script that follows an export's recomputation lines: it builds a
built-in workload's model, recomputes the first ``--recompute-first`` blocks the way the
export's summary.md says (a transformers model's per-layer switch, else each block's
forward wrapped in ``torch.utils.checkpoint``), and hands the exported config to
``deepspeed.initialize``. Rank 0 prints how many blocks recompute and the last loss.

Run by tests/e2e/test_export_recomputation.py through the exported launch.sh.
"""

import argparse
import functools

import deepspeed
import torch
import torch.distributed as dist

from autotune.backends.deepspeed.ops import guard_op_loads
from autotune.workloads import get_workload
from autotune.workloads.checkpointing import checkpoint_leading_blocks, selective_context

parser = argparse.ArgumentParser()
parser.add_argument("--config", "--deepspeed_config", dest="config", required=True)
parser.add_argument("--workload", required=True)
parser.add_argument("--recompute-first", type=int, required=True)
parser.add_argument("--policy", choices=["full", "selective"], default="full")
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
args = parser.parse_args()
guard_op_loads()

workload = get_workload(args.workload)
torch.manual_seed(0)
model = workload.build_model()
blocks = workload.checkpoint_blocks(model)
if hasattr(model, "gradient_checkpointing_enable") and args.policy == "full":
    # summary.md's lines for a transformers model: the switch on, then off past the share
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer in blocks[args.recompute_first :]:
        layer.gradient_checkpointing = False
    recomputing = sum(bool(layer.gradient_checkpointing) for layer in blocks)
else:
    # summary.md's lines for any other model: the first blocks' forward wrapped
    checkpoint_leading_blocks(blocks, args.recompute_first, args.policy)
    recomputing = sum(isinstance(block.forward, functools.partial) for block in blocks)
    assert args.policy == "full" or selective_context() is not None
model.train()
engine, _, _, _ = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), config=args.config
)
batch = workload.make_batch(engine.train_micro_batch_size_per_gpu(), engine.device)
for _ in range(args.steps * engine.gradient_accumulation_steps()):
    loss = workload.loss(engine, batch)
    engine.backward(loss)
    engine.step()
assert torch.isfinite(loss.float()).item()
if dist.get_rank() == 0:
    print(
        f"TRAINED global_steps={engine.global_steps} recomputing={recomputing}/{len(blocks)} "
        f"loss={loss.item():.3f}",
        flush=True,
    )
dist.barrier()
dist.destroy_process_group()
