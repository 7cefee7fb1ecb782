"""A user's training script for the script-mode fault tests: a tiny linear model whose
DeepSpeed config is a dict in code. Its first argument picks how it misbehaves."""

import argparse
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import torch

parser = argparse.ArgumentParser()
parser.add_argument(
    "mode", choices=["train", "hang", "crash", "short", "own_init", "nccl", "child", "once"]
)
args = parser.parse_args()
if args.mode == "once":  # module-level state (a registry, a patched library) run twice breaks
    import builtins

    if getattr(builtins, "_tiny_script_ran", False):
        raise RuntimeError("tiny_script.py cannot run twice in one process")
    builtins._tiny_script_ran = True

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
if args.mode == "hang":  # e.g. waiting for data that never comes
    time.sleep(3600)
if args.mode == "child":  # e.g. a data-loading worker, which lives as long as it is not told
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(f"child-{os.environ.get('RANK', '0')}.pid", "w") as pid_file:
        pid_file.write(str(child.pid))
if args.mode in ("own_init", "nccl"):
    import torch.distributed as dist

    dist.init_process_group(backend="gloo" if args.mode == "own_init" else "nccl")
config = {
    "train_batch_size": 8,
    "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
    "steps_per_print": 1000000,
}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
steps = 3 if args.mode == "short" else 1000
try:
    for micro_step in range(steps * engine.gradient_accumulation_steps()):
        # before the probe's fewest steps (2 warm-up, 2 timed), so it always reaches the crash
        if args.mode == "crash" and micro_step == 2:
            raise ValueError("boom: a bad sample at micro-step 2")
        x = torch.randn(engine.train_micro_batch_size_per_gpu(), 32)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
finally:
    if args.mode == "own_init":  # the group it made, it destroys (however training ends)
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
print("done", file=sys.stderr)
