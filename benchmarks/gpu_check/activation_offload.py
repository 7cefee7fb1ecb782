"""A built-in workload's CUDA peak and step time with ``activation_offload`` none and cpu at
one ``checkpoint_fraction``, beside the memory model's prediction of each: what CPU ranks
cannot show (there host and device are one memory, so a run drops the dimension).

    python benchmarks/gpu_check/activation_offload.py --workload gpt2 --fraction 0.5

Run by the GPU check with ``--activation-offload`` (outside its time plan), or by hand in
its venv. One process, one GPU, no DeepSpeed: the model as the probe builds it (bf16
parameters on the device), AdamW, a few timed steps after a warm-up. Prints one JSON line
per setting; without CUDA it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="gpt2", help="a built-in workload")
    parser.add_argument("--fraction", type=float, default=0.5, help="checkpoint_fraction")
    parser.add_argument("--micro-batch", type=int, default=4, help="samples per step")
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    parser.add_argument("--steps", type=int, default=5, help="timed steps after 2 warm-up")
    return parser.parse_args(argv)


def measure(args: argparse.Namespace, offload: str) -> dict[str, object]:
    """One model trained ``args.steps`` steps with ``offload``: its CUDA peak (allocated,
    from the first step on), the median step time, and the memory model's device and host
    bytes for the same candidate at ZeRO-0 on one rank."""
    import statistics

    import torch

    from autotune.candidate import Candidate
    from autotune.memory import MemoryModel
    from autotune.workloads import get_workload
    from autotune.workloads.activation_offload import apply_offload
    from autotune.workloads.checkpointing import apply_checkpointing

    workload = get_workload(args.workload)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.precision]
    device = torch.device("cuda")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = workload.build_model()
    finally:
        torch.set_default_dtype(previous)
    apply_checkpointing(workload, model, args.fraction)
    apply_offload(workload, model, args.fraction, offload)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    batch = workload.make_batch(args.micro_batch, device)
    times = []
    for step in range(2 + args.steps):
        if step == 1:
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        started = time.perf_counter()
        workload.loss(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= 2:
            times.append(time.perf_counter() - started)
    candidate = Candidate(
        precision=args.precision,
        zero_stage=0,
        micro_batch_size=args.micro_batch,
        gradient_accumulation_steps=1,
        data_parallel_size=1,
        checkpoint_fraction=args.fraction,
        activation_offload=offload,
    )
    predicted = MemoryModel(workload, accelerator="cuda").predict(candidate)
    return {
        "workload": args.workload,
        "checkpoint_fraction": args.fraction,
        "activation_offload": offload,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "step_s": statistics.median(times),
        "predicted_device_bytes": predicted.device_bytes,
        "predicted_host_bytes": predicted.host_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("activation_offload: skipped: no CUDA device (host and device are one memory)")
        return 0
    for offload in ("none", "cpu"):
        print(json.dumps(measure(args, offload)), flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
