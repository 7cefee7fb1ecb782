"""The FSDP2-specific text of the export: ``launch.sh`` (torchrun, the script calling
``fully_shard`` as the probes did; or ``accelerate launch`` where accelerate can run the
tuned settings), ``accelerate_config.yaml`` (accelerate's FSDP2 config with them) and the
summary's lines, among them the ``fully_shard`` calls for a plain-torch script and where
accelerate differs from the probes.

Values from the storage arrive quoted or printable from the caller; numbers are quoted here.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import yaml

from autotune.backends._process_group import CPU_ONLY, CUDA_WITH_HOST
from autotune.backends._shell_text import export_lines, printable
from autotune.backends.fsdp2._config import Fsdp2Config
from autotune.workloads.activation_offload import MIN_OFFLOAD_BYTES

if TYPE_CHECKING:
    from autotune.candidate import Candidate

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
        # accelerate recomputes every block or none: a share is the script's (code_lines)
        "fsdp_activation_checkpointing": parsed.checkpoint_fraction is None
        and parsed.checkpoint_policy is None
        and parsed.activation_checkpointing,
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
    """The files the export writes beside the config: accelerate's config, where accelerate
    can express the tuned settings (not an integer ``reshard_after_forward``)."""
    if _reshard_groups(Fsdp2Config.model_validate(config)):
        return {}
    return {"accelerate_config.yaml": accelerate_config(config, ranks, accelerator, block_class)}


def accelerate_problem(config: dict[str, Any] | None, accelerator: str) -> str | None:
    """Why ``accelerate launch`` cannot run what the probes measured, in one line, or
    None."""
    if accelerator != "cuda":
        return (
            "accelerate does not shard on CPU ranks (its state there is MULTI_CPU, not FSDP); "
            "use LAUNCHER=torchrun"
        )
    groups = _reshard_groups(Fsdp2Config.model_validate(config)) if config else None
    if groups:
        return (
            f"the FSDP2 plugin of accelerate takes reshard_after_forward as true or false "
            f"only, and the tuned config reshards to groups of {groups} ranks; use "
            "LAUNCHER=torchrun"
        )
    return None


def _reshard_groups(config: Fsdp2Config) -> int | None:
    """The group size of an integer ``reshard_after_forward`` (None for true or false)."""
    value = config.fully_shard.reshard_after_forward
    return None if isinstance(value, bool) else value


def launch_script(
    origin: str,
    ranks: int,
    accelerator: str,
    threads_per_rank: int,
    env: Mapping[str, str] | None = None,
    config: dict[str, Any] | None = None,
) -> str:
    """``launch.sh`` that starts the user's script (its first argument) under torchrun,
    handing it ``fsdp2_config.json`` (the script calls ``fully_shard`` as summary.md
    shows: what the probes ran), or with ``LAUNCHER=accelerate`` under accelerate with
    its config, where :func:`accelerate_problem` finds none (else that branch says why
    and exits 2)."""
    accumulation = Fsdp2Config.model_validate(config).gradient_accumulation_steps if config else 1
    device = "GPU(s)" if accelerator == "cuda" else "CPU rank(s)"
    exports = export_lines(env or {}, keep_callers=False)
    problem = accelerate_problem(config, accelerator)
    if problem is None:
        # accelerate launch's --gradient_accumulation_steps reaches its DeepSpeed path only
        # (accelerate/utils/launch.py, prepare_deepspeed_cmd_env); Accelerator() reads this
        # variable whatever the distributed type
        steps = shlex.quote(str(accumulation))
        accelerate = f"""export ACCELERATE_GRADIENT_ACCUMULATION_STEPS={steps}
    exec accelerate launch --config_file "$HERE/accelerate_config.yaml" "$SCRIPT" "$@" ;;"""
    else:
        accelerate = f"""echo {shlex.quote("accelerate cannot run this config: " + problem)} >&2
    exit 2 ;;"""
    return f"""#!/usr/bin/env bash
# autotune export: {origin},
# tuned for {ranks} {device} on one node, with FSDP2.
#
#   ./launch.sh train.py [your script's arguments]    # torchrun
#   LAUNCHER=accelerate ./launch.sh train.py [...]    # accelerate launch (GPUs)
#
# Under torchrun the script reads --fsdp2_config and calls fully_shard itself, as the
# probes did (summary.md shows the lines). accelerate applies accelerate_config.yaml to a
# script that prepares its model with Accelerator(), and differs from the probes where
# summary.md says.
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
SCRIPT="${{1:?usage: $0 train.py [arguments of your script]}}"
shift
# The probes ran with this many intra-op threads per rank.
export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{shlex.quote(str(threads_per_rank))}}}"
{exports}case "${{LAUNCHER:-torchrun}}" in
  torchrun)
    exec torchrun --standalone --nproc-per-node={ranks} \\
      "$SCRIPT" --fsdp2_config "$HERE/fsdp2_config.json" "$@" ;;
  accelerate)
    {accelerate}
  *) echo "LAUNCHER must be torchrun or accelerate, got ${{LAUNCHER}}" >&2; exit 2 ;;
esac
"""


# The accelerate release whose FSDP2 path (utils/launch.py, utils/dataclasses.py
# FullyShardedDataParallelPlugin, utils/fsdp_utils.py fsdp2_prepare_model, accelerator.py)
# the lines below were checked against.
ACCELERATE_CHECKED = "1.16"


def config_usage_lines(ranks: int, script_name: str | None) -> list[str]:
    """The summary's "Files" lines on the config, accelerate's config and ``launch.sh``,
    and where accelerate runs other than the probes did."""
    del script_name
    return [
        "- `fsdp2_config.json`: the tuned FSDP2 settings (fully_shard's policies, the "
        "micro-batch and accumulation, the optimizer).",
        f"- `launch.sh`: starts your script under torchrun on {ranks} rank(s), with "
        "`--fsdp2_config fsdp2_config.json`; your script calls `fully_shard` as shown "
        "below, which is what the probes measured.",
        "- `accelerate_config.yaml`: the same settings for `LAUNCHER=accelerate ./launch.sh` "
        "on GPUs (not written where accelerate cannot express them: an integer "
        "`reshard_after_forward`, which its FSDP2 plugin refuses). Checked against "
        f"accelerate {ACCELERATE_CHECKED}, which runs other than the probes did:",
        "  - it reduces gradients in the parameter dtype (bf16 under bf16) unless your script "
        "passes `mixed_precision_policy` (with the tuned `reduce_dtype`) to its FSDP plugin;",
        "  - under mixed precision it runs the forward under autocast and returns fp32 "
        "outputs, where the probes cast through `MixedPrecisionPolicy` alone;",
        "  - it shards the input embedding, and the final norm with the output head, as "
        "units of their own;",
        "  - `accelerate launch --gradient_accumulation_steps` reaches its DeepSpeed path "
        "only: `launch.sh` exports `ACCELERATE_GRADIENT_ACCUMULATION_STEPS`, which "
        "`Accelerator()` reads, and your script steps under `accelerator.accumulate(model)` "
        "(with `GradientAccumulationPlugin(sync_each_batch=True)` where the config reduces "
        "after each micro-batch).",
    ]


def recomputed_count(fraction: float) -> str:
    """The code of how many of ``blocks`` a share recomputes, as the probes counted them
    (:func:`autotune.workloads.checkpointing.checkpointed_block_count`: halves rounded
    up, at least one), not Python's ``round``, which rounds halves to even and to 0."""
    return f"max(1, int({fraction:g} * len(blocks) + 0.5))"


def _offload_lines(parsed: Fsdp2Config) -> list[str]:
    """The lines that keep the blocks that are not recomputed (the complement of the
    checkpointing lines' share; every block where none is) offloading their saved
    activations to host memory; none where they stay on the device."""
    if parsed.activation_offload is None:
        return []
    fraction = parsed.checkpoint_fraction
    kept = recomputed_count(fraction) if fraction is not None else ""
    return [
        "# the blocks not recomputed keep their saved activations in host memory",
        f"# (parameters and tensors under {MIN_OFFLOAD_BYTES} bytes stay on the device)",
        "from autotune.workloads.activation_offload import offload_blocks",
        "blocks = list(model.blocks)  # each transformer block, in forward order",
        f"offload_blocks(blocks[{kept}:])",
    ]


def code_lines(config: dict[str, Any]) -> list[str]:
    """The ``fully_shard`` calls of the tuned config for a plain-torch training script."""
    parsed = Fsdp2Config.model_validate(config)
    shard = parsed.fully_shard
    # pinned host memory needs an accelerator; the probes pinned wherever CUDA was
    pinned = "CPUOffloadPolicy(pin_memory=torch.cuda.is_available())"
    offload = pinned if shard.cpu_offload else "OffloadPolicy()"
    lines = [
        *(
            ["import functools"]
            if parsed.checkpoint_fraction is not None or parsed.checkpoint_policy is not None
            else []
        ),
        "import torch",
        "from torch.distributed.fsdp import (",
        "    CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard)",
        "",
        "policy = dict(",
        f"    reshard_after_forward={shard.reshard_after_forward!r},",
        f"    mp_policy=MixedPrecisionPolicy(param_dtype={_TORCH_DTYPES[shard.param_dtype]}, "
        f"reduce_dtype={_TORCH_DTYPES[shard.reduce_dtype]}),",
        f"    offload_policy={offload},",
        ")",
        "# NCCL for GPU tensors, gloo for host ones (offloaded shards); gloo on CPU ranks",
        "torch.distributed.init_process_group(",
        f"    {CUDA_WITH_HOST!r} if torch.cuda.is_available() else {CPU_ONLY!r})",
    ]
    if parsed.checkpoint_fraction is not None or parsed.checkpoint_policy is not None:
        fraction = parsed.checkpoint_fraction or 1.0
        options = "use_reentrant=False"
        if parsed.checkpoint_policy is not None:
            # keeps the matmul and attention outputs, recomputes the cheap ops
            options += ", context_fn=autotune.workloads.checkpointing.selective_context()"
        lines += [
            f"# recompute the first {fraction:.2g} of the blocks in backward",
            "blocks = list(model.blocks)  # each transformer block, in forward order",
            f"for block in blocks[: {recomputed_count(fraction)}]:",
            "    block.forward = functools.partial(",
            f"        torch.utils.checkpoint.checkpoint, block.forward, {options})",
        ]
    elif parsed.activation_checkpointing:
        lines.append("model.gradient_checkpointing_enable()  # or checkpoint each block")
    lines += _offload_lines(parsed)
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


# What an FSDP2 config takes of a DeepSpeed base config, besides the keys the search sets.
_FSDP2_TAKES = {
    "optimizer", "gradient_clipping", "train_batch_size", "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps", "fp16", "bf16", "zero_optimization",
}  # fmt: skip


def precision_actions(candidate: Candidate) -> list[str]:
    """What the user's code must do about the candidate's precision: FSDP2 computes in
    bf16 over fp32 shards."""
    if candidate.precision == "bf16":
        return [
            "Build the model in fp32: FSDP2 keeps its shards in fp32 and computes in bf16 "
            "(MixedPrecisionPolicy); do not cast the model yourself."
        ]
    return []


def setup_actions(candidate: Candidate, base: dict[str, Any]) -> list[str]:
    """An FSDP2 winner's steps the script takes itself: reducing after each micro-batch
    under accelerate, and the base config's DeepSpeed-only keys."""
    assert candidate.fsdp is not None
    actions = []
    if candidate.fsdp.sync_each_micro_batch and candidate.gradient_accumulation_steps > 1:
        actions.append(
            "Reduce gradients after each micro-batch: with accelerate, "
            "`Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin("
            f"num_steps={candidate.gradient_accumulation_steps}, sync_each_batch=True))`; "
            "in a plain-torch loop, do not call `set_requires_gradient_sync(False)`."
        )
    left = sorted(set(base) - _FSDP2_TAKES)
    if left:
        keys = ", ".join(f"`{printable(key)}`" for key in left)
        actions.append(
            "fsdp2_config.json carries your base config's optimizer and gradient clipping, "
            f"not its DeepSpeed-only keys ({keys}): set those in your script."
        )
    return actions
