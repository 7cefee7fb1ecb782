"""A user's training script for the GPU check: trains a built-in workload's model with the
exported ds_config.json handed to deepspeed.initialize unedited.

Started by the export's launch.sh (the deepspeed launcher by default, or torchrun), which
passes the config as --deepspeed_config:

    trials/<study>/best/launch.sh benchmarks/gpu_check/train.py --workload gpt2 --steps 20

Prints ``TRAINED global_steps=N loss=L samples_per_s=S`` on rank 0, where S is the median
over the optimizer steps after the first three (the export's throughput, to set beside the
study's measurement).
"""

from __future__ import annotations

import argparse
import statistics
import time

import deepspeed
import torch
import torch.distributed as dist

from autotune.workloads import get_workload

WARM_STEPS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed_config", "--config", dest="config", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--checkpointing", action="store_true", help="as summary.md asks")
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    parser.add_argument(
        "--autotune-ops",
        action="store_true",
        help="load DeepSpeed's ops from autotune's op folder, as its probes do (built without "
        "debug information: the same machine code); the GPU check's ops phase built them",
    )
    args = parser.parse_args()
    if args.autotune_ops:
        from autotune.backends.deepspeed import guard_op_loads

        guard_op_loads()

    workload = get_workload(args.workload)
    model = workload.build_model()
    if args.checkpointing:
        workload.enable_activation_checkpointing(model)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=args.config
    )
    accelerator = deepspeed.get_accelerator()
    batch = workload.make_batch(engine.train_micro_batch_size_per_gpu(), engine.device)
    step_times = []
    loss = torch.zeros(())
    for _ in range(args.steps):
        started = time.perf_counter()
        for _ in range(engine.gradient_accumulation_steps()):
            loss = workload.loss(engine, batch)
            engine.backward(loss)
            engine.step()
        accelerator.synchronize()
        step_times.append(time.perf_counter() - started)
    timed = step_times[WARM_STEPS:] or step_times
    samples_per_s = engine.train_batch_size() / statistics.median(timed)
    if dist.get_rank() == 0:
        print(
            f"TRAINED global_steps={engine.global_steps} loss={loss.item():.4f} "
            f"samples_per_s={samples_per_s:.3f}",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
