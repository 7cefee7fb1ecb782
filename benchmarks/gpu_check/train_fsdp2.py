"""A user's plain-torch training script for the GPU check's FSDP2 phase: trains a built-in
workload's model with the exported ``fsdp2_config.json``, unedited, through autotune's FSDP2
backend (``fully_shard`` per unit with the config's policies, as the probes did).

Started by the export's launch.sh under torchrun, which passes the config as
``--fsdp2_config``:

    LAUNCHER=torchrun fsdp2-export/launch.sh benchmarks/gpu_check/train_fsdp2.py \\
        --workload gpt2 --steps 2

Prints ``TRAINED global_steps=N loss=L samples_per_s=S`` on rank 0 (the line train.py
prints), S the median over the optimizer steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from autotune.backends import get_backend
from autotune.backends.fsdp2 import Fsdp2Config
from autotune.workloads import get_workload
from autotune.workloads.blocks import shard_units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fsdp2_config", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()

    backend = get_backend("fsdp2")
    text = Path(args.fsdp2_config).read_text()
    config = Fsdp2Config.model_validate_json(text)
    backend.start_process_group()
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    workload = get_workload(args.workload)
    with device:
        model = workload.build_model()
    if config.activation_checkpointing:
        workload.enable_activation_checkpointing(model)
    engine = backend.initialize_engine(
        model, config.model_dump(mode="json"), shard_units(workload, model)
    )
    batch = workload.make_batch(config.train_micro_batch_size_per_gpu, device)
    step_times = []
    loss = torch.zeros(())
    for _ in range(args.steps):
        started = time.perf_counter()
        for _ in range(config.gradient_accumulation_steps):
            loss = workload.loss(engine, batch)
            engine.backward(loss)
            engine.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_times.append(time.perf_counter() - started)
    samples_per_s = config.train_batch_size / statistics.median(step_times)
    if dist.get_rank() == 0:
        print(
            f"TRAINED global_steps={len(step_times)} loss={loss.item():.4f} "
            f"samples_per_s={samples_per_s:.3f}",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
