"""The training script DeepSpeed's own autotuner launches
(benchmarks/vs_deepspeed/vs_deepspeed_autotuner.py).

DeepSpeed's autotuner starts ``deepspeed --include ... THIS_SCRIPT --workload W
--deepspeed_config <base64 config>`` once per experiment; the engine itself stops the script
(``exit()``) after its profiled steps, having written the experiment's metrics. The script
trains an autotune workload exactly as autotune's probe does (same model, synthetic batches,
loss and optimizer from the config), so both tuners measure the same training.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def main() -> None:
    import deepspeed
    import torch

    from autotune.workloads import get_workload

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=1000)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(0)
    workload = get_workload(args.workload)
    model = workload.build_model()
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=args.deepspeed_config
    )
    micro_batch = engine.train_micro_batch_size_per_gpu()
    accumulation = engine.gradient_accumulation_steps()
    device = torch.device(engine.device)
    try:
        for _ in range(args.max_steps):  # the engine exits after its profiled steps
            for _ in range(accumulation):
                loss = workload.loss(engine, workload.make_batch(micro_batch, device))
                engine.backward(loss)
                engine.step()
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
