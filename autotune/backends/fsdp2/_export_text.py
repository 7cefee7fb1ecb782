"""The FSDP2-specific text of the export: ``accelerate_config.yaml`` (accelerate's FSDP2
config with the tuned settings), ``launch.sh`` (``accelerate launch`` with it, or torchrun)
and the summary's lines, among them the ``fully_shard`` calls for a plain-torch script.

Values from the storage arrive quoted or printable from the caller; numbers are quoted here.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import yaml

from autotune.backends._shell_text import export_lines
from autotune.backends.fsdp2._config import Fsdp2Config

_TORCH_DTYPES = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}


def accelerate_config(
    config: dict[str, Any], ranks: int, accelerator: str, block_class: str
) -> str:
    """accelerate's config file (``accelerate launch --config_file``) for the tuned FSDP2
    settings on ``ranks`` processes of one machine; ``block_class``: the class of the
    model's transformer blocks, wrapped one unit each ("" where the model is one unit)."""
    parsed = Fsdp2Config.model_validate(config)
    shard = parsed.fully_shard
    fsdp: dict[str, Any] = {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": shard.reshard_after_forward,
        "fsdp_offload_params": shard.cpu_offload,
        "fsdp_activation_checkpointing": parsed.activation_checkpointing,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_cpu_ram_efficient_loading": False,
    }
    if shard.wrap == "block" and block_class:
        fsdp["fsdp_auto_wrap_policy"] = "TRANSFORMER_BASED_WRAP"
        fsdp["fsdp_transformer_layer_cls_to_wrap"] = block_class
    else:
        fsdp["fsdp_auto_wrap_policy"] = "NO_WRAP"
    document = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "mixed_precision": "no" if shard.param_dtype == "fp32" else shard.param_dtype,
        "num_machines": 1,
        "num_processes": ranks,
        "machine_rank": 0,
        "use_cpu": accelerator == "cpu",
        "fsdp_config": fsdp,
    }
    return yaml.safe_dump(document, sort_keys=False)


def export_files(
    config: dict[str, Any], ranks: int, accelerator: str, block_class: str
) -> dict[str, str]:
    """The files the export writes beside the config: accelerate's config."""
    return {"accelerate_config.yaml": accelerate_config(config, ranks, accelerator, block_class)}


def launch_script(
    origin: str,
    ranks: int,
    accelerator: str,
    threads_per_rank: int,
    env: Mapping[str, str] | None = None,
    config: dict[str, Any] | None = None,
) -> str:
    """``launch.sh`` that starts the user's script (its first argument) under accelerate
    with the tuned config and accumulation steps, or under torchrun handing it
    ``fsdp2_config.json``."""
    accumulation = Fsdp2Config.model_validate(config).gradient_accumulation_steps if config else 1
    device = "GPU(s)" if accelerator == "cuda" else "CPU rank(s)"
    # accelerate applies FSDP only on accelerators (on CPU ranks its state is MULTI_CPU,
    # which leaves the model unsharded): CPU ranks launch with torchrun.
    default = "accelerate" if accelerator == "cuda" else "torchrun"
    exports = export_lines(env or {})
    return f"""#!/usr/bin/env bash
# autotune export: {origin},
# tuned for {ranks} {device} on one node, with FSDP2.
#
#   ./launch.sh train.py [your script's arguments]    # {default}
#   LAUNCHER=accelerate ./launch.sh train.py [...]    # accelerate launch (GPUs)
#   LAUNCHER=torchrun ./launch.sh train.py [...]      # torchrun
#
# accelerate applies accelerate_config.yaml to a script that prepares its model with
# Accelerator() (on GPUs: on CPU ranks accelerate does not shard); under torchrun the
# script reads --fsdp2_config and calls fully_shard itself (summary.md shows the lines).
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
SCRIPT="${{1:?usage: $0 train.py [arguments of your script]}}"
shift
# The probes ran with this many intra-op threads per rank.
export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{shlex.quote(str(threads_per_rank))}}}"
{exports}case "${{LAUNCHER:-{default}}}" in
  accelerate)
    exec accelerate launch --config_file "$HERE/accelerate_config.yaml" \\
      --gradient_accumulation_steps {accumulation} "$SCRIPT" "$@" ;;
  torchrun)
    exec torchrun --standalone --nproc-per-node={ranks} \\
      "$SCRIPT" --fsdp2_config "$HERE/fsdp2_config.json" "$@" ;;
  *) echo "LAUNCHER must be accelerate or torchrun, got ${{LAUNCHER}}" >&2; exit 2 ;;
esac
"""


def config_usage_lines(ranks: int, script_name: str | None) -> list[str]:
    """The summary's "Files" lines on the config, accelerate's config and ``launch.sh``."""
    del script_name
    return [
        "- `fsdp2_config.json`: the tuned FSDP2 settings (fully_shard's policies, the "
        "micro-batch and accumulation, the optimizer).",
        "- `accelerate_config.yaml`: the same for `accelerate launch --config_file`; "
        "accelerate reduces gradients in the parameter dtype unless your script passes "
        "`mixed_precision_policy` to its FSDP plugin.",
        f"- `launch.sh`: starts your script with accelerate on GPUs, torchrun on CPU ranks "
        f"(`LAUNCHER=` either) on {ranks} rank(s).",
    ]


def code_lines(config: dict[str, Any]) -> list[str]:
    """The ``fully_shard`` calls of the tuned config for a plain-torch training script."""
    parsed = Fsdp2Config.model_validate(config)
    shard = parsed.fully_shard
    offload = "CPUOffloadPolicy()" if shard.cpu_offload else "OffloadPolicy()"
    lines = [
        "from torch.distributed.fsdp import (",
        "    CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard)",
        "",
        "policy = dict(",
        f"    reshard_after_forward={shard.reshard_after_forward!r},",
        f"    mp_policy=MixedPrecisionPolicy(param_dtype={_TORCH_DTYPES[shard.param_dtype]}, "
        f"reduce_dtype={_TORCH_DTYPES[shard.reduce_dtype]}),",
        f"    offload_policy={offload},",
        ")",
    ]
    if parsed.activation_checkpointing:
        lines.append("model.gradient_checkpointing_enable()  # or checkpoint each block")
    if shard.wrap == "block":
        lines += [
            "for block in model.blocks:  # each transformer block",
            "    fully_shard(block, **policy)",
        ]
    lines += [
        'fully_shard(model, **{**policy, "reshard_after_forward": None})  # the root: kept',
        "optimizer = torch.optim." + _optimizer_call(parsed.optimizer),
        *_accumulation_lines(parsed),
    ]
    return lines


def _accumulation_lines(parsed: Fsdp2Config) -> list[str]:
    split = (
        f"# {parsed.gradient_accumulation_steps} micro-batch(es) of "
        f"{parsed.train_micro_batch_size_per_gpu} per step; "
    )
    if parsed.sync_each_micro_batch:
        return [split + "gradients reduced after each (FSDP2's default)"]
    return [
        split + "before each backward:",
        "# model.set_requires_gradient_sync(is_last_micro_batch)",
    ]


def _optimizer_call(optimizer: dict[str, Any]) -> str:
    from autotune.backends.fsdp2._config import optimizer_class

    params = ", ".join(f"{k}={v!r}" for k, v in optimizer.get("params", {}).items())
    return f"{optimizer_class(optimizer)}(model.parameters(){', ' if params else ''}{params})"
