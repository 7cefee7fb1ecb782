"""The chosen configuration as the summary's settings table, and what the user must do in
their own code to train as it was probed, for each backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.export._loss_check_lines import printable
from autotune.export._numerics import numerics_actions
from autotune.protocol import HOST_PEAK_WORDS
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.candidate import Candidate
    from autotune.study import StudyConfig, TrialView


def _peaks(values: list[int]) -> str:
    return ", ".join(format_bytes(v) for v in values) or "n/a"


def _checkpointing_action(candidate: Candidate, config: StudyConfig) -> str:
    from autotune.backends import get_backend

    script = config.script
    if script is not None and "activation_checkpointing" in script.flags:
        state = "on" if candidate.activation_checkpointing else "off"
        flag = script.flags["activation_checkpointing"]
        return f"Activation checkpointing is {state}: launch.sh sets `{flag}` so."
    if not candidate.activation_checkpointing:
        return "Keep activation checkpointing off (it was off in the probes)."
    wrapping = "`fully_shard`" if candidate.backend == "fsdp2" else "`deepspeed.initialize`"
    return (
        "Turn activation checkpointing on in your model: for a transformers model call "
        "`model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
        f'{{"use_reentrant": False}})` before {wrapping}; otherwise wrap each '
        "transformer block in "
        "`torch.utils.checkpoint.checkpoint(block, ..., use_reentrant=False)`. "
        f"{get_backend(candidate.backend).config_file_name} cannot switch this on for you."
    )


def user_actions_of(candidate: Candidate, trial: TrialView, config: StudyConfig) -> list[str]:
    """What the user must do in their own code to train as the trial was probed."""
    fsdp2 = candidate.backend == "fsdp2"
    actions = [_checkpointing_action(candidate, config)]
    if candidate.precision == "fp16":
        actions.append(
            "fp16 uses DeepSpeed's dynamic loss scaling (ds_config.json); do not add your own "
            "GradScaler."
        )
    if candidate.precision == "bf16" and fsdp2:
        actions.append(
            "Build the model in fp32: FSDP2 keeps its shards in fp32 and computes in bf16 "
            "(MixedPrecisionPolicy); do not cast the model yourself."
        )
    elif candidate.precision == "bf16":
        actions.append("DeepSpeed casts the model to bf16; do not call `model.half()` yourself.")
    actions += numerics_actions(config)
    if fsdp2:
        actions += _fsdp2_actions(candidate, config.base_config or {})
    if "cpu" in (candidate.offload_optimizer, candidate.offload_param):
        actions.append(
            "CPU offload keeps optimizer states (and parameters) in host RAM: the probes' "
            f"processes reached {_peaks(trial.record.host_peak_bytes_per_rank)} per rank "
            f"({HOST_PEAK_WORDS[trial.record.host_peak_method]}); leave that much free per "
            "rank on each node."
        )
    if "nvme" in (candidate.offload_optimizer, candidate.offload_param):
        actions.append(
            f"NVMe offload writes to {config.nvme_path}: that folder must exist, on an NVMe "
            "disk, on every node."
        )
    if config.global_batch is None:
        actions.append(
            f"The global batch was searched (--global-batch auto, up to "
            f"{config.max_global_batch}): the chosen one is {candidate.train_batch_size}. "
            "If it differs from the batch your learning rate was tuned for, rescale the "
            "learning rate (e.g. linearly with the batch) and re-check convergence."
        )
    if config.accelerator == "cpu":
        ranks = "gloo" if fsdp2 else "DeepSpeed's CPU accelerator"
        actions.append(
            f"These are CPU ranks ({ranks}); run with "
            f"OMP_NUM_THREADS={config.threads_per_rank} as the probes did (launch.sh does)."
        )
    return actions


def setting_rows(candidate: Candidate, *, searched: bool = False) -> list[str]:
    ratio = (
        f" (ratio {candidate.offload_optimizer_ratio:g})"
        if candidate.offload_optimizer_ratio < 1
        else ""
    )
    if candidate.fsdp is not None:
        return _fsdp2_rows(candidate, searched=searched)
    knobs = ", ".join(f"{k}={v}" for k, v in candidate.zero_knobs.items()) or "DeepSpeed defaults"
    return [
        "| setting | value |",
        "| --- | --- |",
        f"| precision | {candidate.precision} |",
        f"| ZeRO stage | {candidate.zero_stage} |",
        f"| optimizer offload | {candidate.offload_optimizer}{ratio} |",
        f"| parameter offload | {candidate.offload_param} |",
        f"| micro-batch per rank | {candidate.micro_batch_size} |",
        f"| gradient accumulation | {candidate.gradient_accumulation_steps} |",
        *([f"| data-parallel ranks (GPUs) | {candidate.data_parallel_size} |"] if searched else []),
        f"| global batch | {candidate.train_batch_size} |",
        f"| activation checkpointing | {'on' if candidate.activation_checkpointing else 'off'} |",
        f"| fine ZeRO knobs | {knobs} |",
    ]


def _fsdp2_rows(candidate: Candidate, *, searched: bool) -> list[str]:
    assert candidate.fsdp is not None
    reduce = "fp32" if candidate.precision == "fp32" else candidate.fsdp.reduce_dtype
    units = "each transformer block, then the root"
    if candidate.fsdp.wrap == "model":
        units = "the whole model"
    return [
        "| setting | value |",
        "| --- | --- |",
        "| backend | FSDP2 (`fully_shard`) |",
        f"| precision (MixedPrecisionPolicy) | {candidate.precision}, reduce in {reduce} |",
        f"| reshard_after_forward | {candidate.fsdp.reshard_after_forward} |",
        f"| CPU offload (CPUOffloadPolicy) | {'on' if candidate.fsdp_cpu_offload else 'off'} |",
        f"| fully_shard units | {units} |",
        f"| micro-batch per rank | {candidate.micro_batch_size} |",
        f"| gradient accumulation | {candidate.gradient_accumulation_steps} |",
        *_fsdp2_sync_row(candidate),
        *([f"| data-parallel ranks (GPUs) | {candidate.data_parallel_size} |"] if searched else []),
        f"| global batch | {candidate.train_batch_size} |",
        f"| activation checkpointing | {'on' if candidate.activation_checkpointing else 'off'} |",
    ]


# What an FSDP2 config takes of a DeepSpeed base config, besides the keys the search sets.
_FSDP2_TAKES = {
    "optimizer", "gradient_clipping", "train_batch_size", "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps", "fp16", "bf16", "zero_optimization",
}  # fmt: skip


def _fsdp2_actions(candidate: Candidate, base: dict[str, Any]) -> list[str]:
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


def _fsdp2_sync_row(candidate: Candidate) -> list[str]:
    """When an accumulating FSDP2 candidate reduces its gradients, and how accelerate and
    the HF Trainer are told to do the same (accelerate's default is the last micro-batch)."""
    assert candidate.fsdp is not None
    if candidate.gradient_accumulation_steps == 1:
        return []
    if not candidate.fsdp.sync_each_micro_batch:
        return ["| gradients reduced | on the last micro-batch (unsharded ones accumulated) |"]
    return [
        "| gradients reduced | after each micro-batch (their shards accumulated): accelerate's "
        "`GradientAccumulationPlugin(sync_each_batch=True)`, the HF Trainer's "
        '`accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}}` |'
    ]
