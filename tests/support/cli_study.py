"""A short study of real probes through the CLI: a small space and fixed-length probes."""

from __future__ import annotations

import json
from pathlib import Path

# One ZeRO stage, one precision, four micro-batches: every candidate has the same shape, so
# an OOM at one micro-batch speaks for the larger ones.
SMALL_SPACE = """\
precision: [fp32]
zero_stage: [0]
offload_optimizer: [none]
offload_param: [none]
micro_batch_size: [1, 2, 4, 8]
gradient_accumulation_steps: [1, 2, 4, 8]
activation_checkpointing: [false]
"""
# Short fixed-length probes; no early stop and no confirmation round, so that trial counts
# and states are what each test sets up (those features have their own tests).
FAST = [
    "--warmup-steps", "1", "--timed-steps", "2", "--max-timed-steps", "2",
    "--no-early-stop", "--no-confirm",
]  # fmt: skip


def base_args(workdir: Path, *extra: str) -> list[str]:
    space = workdir / "small.yaml"
    space.write_text(SMALL_SPACE)
    return ["run", "--workload", "gpt-tiny", "--gpus", "2", "--space", str(space), *FAST, *extra]


EXPORTED_CONFIGS = {"ds_config.json": "deepspeed", "fsdp2_config.json": "fsdp2"}


def exported_config(best_dir: Path) -> tuple[str, dict]:
    """The backend and config of an export: a study over the default space exports
    DeepSpeed's ``ds_config.json`` or FSDP2's ``fsdp2_config.json``, exactly one."""
    (name,) = [name for name in EXPORTED_CONFIGS if (best_dir / name).is_file()]
    return EXPORTED_CONFIGS[name], json.loads((best_dir / name).read_text())
