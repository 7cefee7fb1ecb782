"""What the export says of activation checkpointing and offload: the settings table's cell,
and how to recompute in production as the probes did (the share of the blocks, which ones,
the policy), for a transformers model, any other model, or a script's own flags, and how to
keep the other blocks' activations on the host where the probes did."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.workloads.activation_offload import MIN_OFFLOAD_BYTES

if TYPE_CHECKING:
    from autotune.candidate import Candidate
    from autotune.study import StudyConfig

_SELECTIVE = (
    " Recompute selectively, as the probes did: pass `context_fn=autotune.workloads."
    "checkpointing.selective_context()` with `use_reentrant=False` (transformers: in "
    "`gradient_checkpointing_kwargs`), which keeps the matmul and attention outputs "
    "(torch's `create_selective_checkpoint_contexts`) and recomputes the cheap ops."
)


def checkpointing_cell(candidate: Candidate) -> str:
    """The settings table's value: on, off, or the share of the blocks; ``, selective``."""
    if candidate.checkpoint_fraction in (0, 1):
        cell = "on" if candidate.activation_checkpointing else "off"
    else:
        cell = f"first {candidate.checkpoint_fraction:.2g} of the blocks"
    cell += ", selective" if candidate.checkpoint_policy == "selective" else ""
    return cell + ("; other blocks' activations on the host" if _offloads(candidate) else "")


def _offloads(candidate: Candidate) -> bool:
    return candidate.activation_offload != "none"


def offload_action(candidate: Candidate, config: StudyConfig) -> list[str]:
    """How to keep the kept blocks' saved activations on the host as the probes did; none
    where they stayed on the device."""
    from autotune.workloads.checkpointing import checkpointed_block_count

    if not _offloads(candidate):
        return []
    blocks = _block_count(config.workload, partial=False)
    kept = "the blocks that are not recomputed"
    if blocks is not None:
        first = checkpointed_block_count(candidate.checkpoint_fraction, blocks)
        kept = f"the last {blocks - first} of the model's {blocks} transformer blocks"
    return [
        f"Keep the saved activations of {kept} in host memory, as the probes did: run each "
        "one's forward under `autotune.workloads.activation_offload.offload_saved_tensors()` "
        "(`offload_blocks(blocks[k:])` there patches them, k the blocks recomputed), "
        "saved-tensor hooks that copy to pinned host memory and back, leaving parameters and "
        f"tensors under {MIN_OFFLOAD_BYTES} bytes on the device (torchtune's "
        "`OffloadActivations` pattern). "
        "torch's built-in `torch.autograd.graph.save_on_cpu(pin_memory=True)` around the same "
        "blocks is simpler, but it moves parameters too. Budget the host memory summary.md "
        "predicts per node."
    ]


def checkpointing_action(candidate: Candidate, config: StudyConfig) -> str:
    """How to train with the trial's checkpointing in the user's own code."""
    from autotune.backends import get_backend

    script = config.script
    if script is not None and "checkpoint_fraction" in script.flags:
        flag = script.flags["checkpoint_fraction"]
        return (
            f"{_recomputed_share(candidate).capitalize()}: launch.sh sets "
            f"`{flag} {candidate.checkpoint_fraction:g}` so."
        )
    if script is not None and "activation_checkpointing" in script.flags:
        state = "on" if candidate.activation_checkpointing else "off"
        flag = script.flags["activation_checkpointing"]
        return f"Activation checkpointing is {state}: launch.sh sets `{flag}` so."
    if not candidate.activation_checkpointing:
        return "Keep activation checkpointing off (it was off in the probes)."
    wrapping = get_backend(candidate.backend).engine_entry
    selective = _SELECTIVE if candidate.checkpoint_policy == "selective" else ""
    if candidate.checkpoint_fraction < 1:
        return _partial_action(candidate, config, wrapping) + selective
    return (
        "Turn activation checkpointing on in your model: for a transformers model call "
        "`model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
        f'{{"use_reentrant": False}})` before {wrapping}; otherwise wrap each '
        "transformer block in "
        "`torch.utils.checkpoint.checkpoint(block, ..., use_reentrant=False)`. "
        f"{get_backend(candidate.backend).config_file_name} cannot switch this on for you."
        + selective
    )


def _recomputed_share(candidate: Candidate) -> str:
    """The share of blocks recomputed, in words: e.g. "the first 0.5 of the blocks
    recomputed in backward"."""
    if not candidate.activation_checkpointing:
        return "activation checkpointing off"
    if candidate.checkpoint_fraction == 1:
        return "every block's activations recomputed in backward"
    return f"the first {candidate.checkpoint_fraction:.2g} of the blocks recomputed in backward"


def _partial_action(candidate: Candidate, config: StudyConfig, wrapping: str) -> str:
    """How to recompute the first k of n blocks as the probes did, k and n counted on the
    study's workload where it can be built here."""
    from autotune.workloads.checkpointing import checkpointed_block_count

    blocks = _block_count(config.workload)
    if blocks is None:
        share = f"the first {candidate.checkpoint_fraction:.2g} of your transformer blocks"
        first = "the first k blocks"
        rest = "layers[k:]"
    else:
        count = checkpointed_block_count(candidate.checkpoint_fraction, blocks)
        share = f"the first {count} of the model's {blocks} transformer blocks"
        first = f"the first {count} blocks"
        rest = f"layers[{count}:]"
    return (
        f"Recompute the activations of {share} (it was so in the probes; the later blocks "
        "keep theirs). For a transformers model: call `model.gradient_checkpointing_enable("
        'gradient_checkpointing_kwargs={"use_reentrant": False})`, then set '
        f"`layer.gradient_checkpointing = False` on `{rest}` of its decoder layers, before "
        f"{wrapping}. Otherwise wrap {first}' forward: `block.forward = functools.partial("
        "torch.utils.checkpoint.checkpoint, block.forward, use_reentrant=False)` (autotune."
        "workloads.checkpointing.checkpoint_leading_blocks does this)."
    )


def _block_count(workload_ref: str, *, partial: bool = True) -> int | None:
    """The blocks of the study's workload: those a checkpoint fraction counts (``partial``;
    None where its switch recomputes all or none), else all of them (those offloaded); None
    where it is a script or cannot be built here."""
    from autotune.errors import AutotuneError
    from autotune.workloads import get_workload
    from autotune.workloads.checkpointing import block_count, partial_checkpointing_blocks

    try:
        workload = get_workload(workload_ref)
        return partial_checkpointing_blocks(workload) if partial else block_count(workload)
    except (AutotuneError, ImportError, OSError):
        return None
