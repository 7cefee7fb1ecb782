"""What the export says to a person: ``summary.md`` and ``launch.sh``."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from autotune.candidate import Candidate
from autotune.settings import format_bytes
from autotune.study import is_repeat

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from autotune.study import StudyConfig

RUNNERS_UP = 5


def _rate(trial: FrozenTrial) -> str:
    attrs = trial.user_attrs
    rate = attrs.get("samples_per_s", 0.0)
    low, high = attrs.get("samples_per_s_min", rate), attrs.get("samples_per_s_max", rate)
    return f"{rate:.1f} samples/s (steps ranged {low:.1f}-{high:.1f})"


def _peaks(values: list[int]) -> str:
    return ", ".join(format_bytes(v) for v in values) or "n/a"


def render_launch(study: optuna.Study, trial: FrozenTrial, config: StudyConfig) -> str:
    ranks = config.gpus_per_trial
    label = trial.user_attrs.get("label", "")
    device = "GPU(s)" if config.accelerator == "cuda" else "CPU rank(s)"
    cpu_env = (
        'export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"\n' if config.accelerator == "cpu" else ""
    )
    return f"""#!/usr/bin/env bash
# autotune export: study {study.study_name}, trial {trial.number} ({label}),
# tuned for {ranks} {device} on one node.
#
#   ./launch.sh train.py [your script's arguments]                     # deepspeed launcher
#   LAUNCHER=torchrun ./launch.sh train.py [your script's arguments]   # torchrun
#
# Your script hands the config to deepspeed.initialize(config=...); this script passes
# its path as --deepspeed_config (change the flag below if your script reads another one).
set -euo pipefail
CONFIG="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)/ds_config.json"
SCRIPT="${{1:?usage: $0 train.py [arguments of your script]}}"
shift
# The probes ran with this many intra-op threads per rank.
export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{config.threads_per_rank}}}"
{cpu_env}case "${{LAUNCHER:-deepspeed}}" in
  deepspeed)
    exec deepspeed --num_gpus={ranks} "$SCRIPT" --deepspeed_config "$CONFIG" "$@" ;;
  torchrun)
    exec torchrun --standalone --nproc-per-node={ranks} \\
      "$SCRIPT" --deepspeed_config "$CONFIG" "$@" ;;
  *) echo "LAUNCHER must be deepspeed or torchrun, got ${{LAUNCHER}}" >&2; exit 2 ;;
esac
"""


def _infeasible_counts(trials: list[FrozenTrial]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for trial in trials:
        attrs = trial.user_attrs
        if attrs.get("pruned_by"):
            counts[f"predicted over the limit ({attrs['pruned_by']}), not probed"] += 1
        elif attrs.get("status") == "oom":
            counts["ran out of memory in the probe"] += 1
        elif attrs.get("status") == "ok" and not attrs.get("feasible"):
            counts["measured peak above the limit"] += 1
    return counts


def _failed_counts(trials: list[FrozenTrial]) -> Counter[str]:
    return Counter(
        str(t.user_attrs.get("status"))
        for t in trials
        if t.user_attrs.get("status") in ("error", "timeout", "interrupted")
    )


def _actions(candidate: Candidate, trial: FrozenTrial, config: StudyConfig) -> list[str]:
    actions = []
    if candidate.activation_checkpointing:
        actions.append(
            "Turn activation checkpointing on in your model: for a transformers model call "
            "`model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
            '{"use_reentrant": False})` (named `activation_checkpointing_enable` from '
            "transformers 5) before `deepspeed.initialize`; otherwise wrap each transformer "
            "block in "
            "`torch.utils.checkpoint.checkpoint(block, ..., use_reentrant=False)`. "
            "ds_config.json cannot switch this on for you."
        )
    else:
        actions.append("Keep activation checkpointing off (it was off in the probes).")
    if candidate.precision == "fp16":
        actions.append(
            "fp16 uses DeepSpeed's dynamic loss scaling (ds_config.json); do not add your own "
            "GradScaler."
        )
    if candidate.precision == "bf16":
        actions.append("DeepSpeed casts the model to bf16; do not call `model.half()` yourself.")
    host = trial.user_attrs.get("host_peak_bytes_per_rank") or []
    if "cpu" in (candidate.offload_optimizer, candidate.offload_param):
        actions.append(
            "CPU offload keeps optimizer states (and parameters) in host RAM: the probes' "
            f"processes peaked at {_peaks(host)} resident per rank; leave that much free "
            "per rank on each node."
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
        actions.append(
            f"These are CPU ranks (DeepSpeed's CPU accelerator); run with "
            f"OMP_NUM_THREADS={config.threads_per_rank} as the probes did (launch.sh does)."
        )
    return actions


def render_summary(study: optuna.Study, trial: FrozenTrial, config: StudyConfig) -> str:
    from autotune.export import feasible_trials

    candidate = Candidate.model_validate(trial.user_attrs["candidate"])
    attrs = trial.user_attrs
    evaluated = [t for t in study.get_trials(deepcopy=False) if not is_repeat(t)]
    evaluated = [t for t in evaluated if "candidate" in t.user_attrs]
    ranked = feasible_trials(study)
    best_rate = trial.value or 0.0
    limit = config.vram_limit_bytes
    memory_kind = "device memory" if config.accelerator == "cuda" else "tracked tensor memory"
    ratio = (
        f" (ratio {candidate.offload_optimizer_ratio:g})"
        if candidate.offload_optimizer_ratio < 1
        else ""
    )
    knobs = ", ".join(f"{k}={v}" for k, v in candidate.zero_knobs.items()) or "DeepSpeed defaults"
    lines = [
        f"# autotune: {candidate.label}",
        "",
        f"Study `{study.study_name}`, trial {trial.number}: workload `{config.workload}` on "
        f"{config.gpus_per_trial} {'GPU' if config.accelerator == 'cuda' else 'CPU rank'}(s), "
        f"memory limit {format_bytes(limit)} per rank.",
        "",
        "## Chosen configuration",
        "",
        "| setting | value |",
        "| --- | --- |",
        f"| precision | {candidate.precision} |",
        f"| ZeRO stage | {candidate.zero_stage} |",
        f"| optimizer offload | {candidate.offload_optimizer}{ratio} |",
        f"| parameter offload | {candidate.offload_param} |",
        f"| micro-batch per rank | {candidate.micro_batch_size} |",
        f"| gradient accumulation | {candidate.gradient_accumulation_steps} |",
        f"| global batch | {candidate.train_batch_size} |",
        f"| activation checkpointing | {'on' if candidate.activation_checkpointing else 'off'} |",
        f"| fine ZeRO knobs | {knobs} |",
        "",
        "## Why",
        "",
        f"- Fastest of {len(ranked)} feasible configurations measured: {_rate(trial)}, "
        f"{attrs.get('tokens_per_s', 0.0):.0f} tokens/s.",
        f"- Peak {memory_kind} per rank: {_peaks(attrs.get('peak_bytes_per_rank') or [])} "
        f"of {format_bytes(limit)} allowed.",
    ]
    if "cpu" in (candidate.offload_optimizer, candidate.offload_param):
        host = attrs.get("host_peak_bytes_per_rank") or []
        lines.append(f"- Host memory (resident, per rank process): {_peaks(host)}.")
    from autotune.confirm import load

    verdict = load(study)
    if verdict is not None and verdict.contenders:
        lines += [
            "",
            "## Confirmation round",
            "",
            f"The top {len(verdict.contenders)} were probed again, interleaved, in "
            f"{verdict.rounds} round(s)"
            + (
                f", then {verdict.tie_rounds} more of the best two to break a tie"
                if verdict.tie_rounds
                else ""
            )
            + f" ({verdict.seconds:.0f} s of the budget); means with "
            "their 95% intervals over every probe of each:",
            "",
        ]
        for contender in verdict.contenders:
            chosen = " (chosen)" if contender.trial == trial.number else ""
            lines.append(f"- trial {contender.trial} {contender.describe()}{chosen}")
        if verdict.tie:
            lines.append(
                "- The best two overlap within the noise of this machine: either is a sound "
                "choice; the higher mean was taken."
            )
    if len(ranked) > 1:
        lines += [
            "",
            "## Runners-up",
            "",
            "| trial | configuration | samples/s | of best | peak per rank |",
            "| --- | --- | --- | --- | --- |",
        ]
        for other in ranked[1 : 1 + RUNNERS_UP]:
            share = 100 * (other.value or 0.0) / best_rate if best_rate else 0.0
            lines.append(
                f"| {other.number} | {other.user_attrs.get('label', '')} | "
                f"{other.value:.1f} | {share:.0f}% | "
                f"{_peaks(other.user_attrs.get('peak_bytes_per_rank') or [])} |"
            )
    infeasible = _infeasible_counts(evaluated)
    failed = _failed_counts(evaluated)
    lines += ["", "## Search", ""]
    lines.append(
        f"- {len(evaluated)} candidates evaluated: {len(ranked)} feasible, "
        f"{sum(infeasible.values())} infeasible, {sum(failed.values())} failed."
    )
    for reason, count in infeasible.most_common():
        lines.append(f"  - infeasible, {reason}: {count}")
    evaluated_keys = {t.user_attrs.get("candidate_key") for t in evaluated}
    screened = set(study.user_attrs.get("autotune_screened") or []) - evaluated_keys
    if screened:
        lines.append(
            f"- {len(screened)} more candidates were predicted over the limit by the memory "
            "model and never proposed (`autotune plan --all` shows each prediction)."
        )
    for status, count in failed.most_common():
        lines.append(f"  - {status}: {count}")
    lines += ["", "## What you must do", ""]
    lines += [f"- {action}" for action in _actions(candidate, trial, config)]
    lines += [
        "",
        "## Files",
        "",
        "- `ds_config.json`: pass it to `deepspeed.initialize(config=...)` unchanged.",
        "- `launch.sh`: starts your script with the deepspeed launcher or torchrun "
        f"(`LAUNCHER=torchrun`) on {config.gpus_per_trial} rank(s).",
        "",
    ]
    return "\n".join(lines)
