"""The chosen configuration as the summary's settings table, and what the user must do in
their own code to train as it was probed, for each backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.export._checkpointing_lines import (
    checkpointing_action,
    checkpointing_cell,
    offload_action,
)
from autotune.export._numerics import numerics_actions
from autotune.protocol import HOST_PEAK_WORDS
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.candidate import Candidate
    from autotune.study import StudyConfig, TrialView


def _peaks(values: list[int]) -> str:
    return ", ".join(format_bytes(v) for v in values) or "n/a"


def user_actions_of(candidate: Candidate, trial: TrialView, config: StudyConfig) -> list[str]:
    """What the user must do in their own code to train as the trial was probed."""
    from autotune.backends import get_backend

    backend = get_backend(candidate.backend)
    actions = [checkpointing_action(candidate, config), *offload_action(candidate, config)]
    actions += backend.precision_actions(candidate)
    actions += numerics_actions(config)
    actions += backend.setup_actions(candidate, config.base_config or {})
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
        ranks = backend.cpu_ranks_runtime
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
        f"| activation checkpointing | {checkpointing_cell(candidate)} |",
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
        f"| activation checkpointing | {checkpointing_cell(candidate)} |",
    ]


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
