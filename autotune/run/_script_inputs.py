"""Planning a study of the user's own script: what stands in for the workload, the base
config, the global batch, and what the space can vary in this script.

- The **base config** is the file the script's arguments name (``--deepspeed`` /
  ``--deepspeed_config``), or ``--base-config``; every key the search does not vary is kept.
  Keys the search varies (stage, precision, batch) are the script's starting point, laid
  over per candidate (not refused, as they are for a ``--base-config`` of a workload).
- The **global batch** is ``--global-batch`` (``auto``: searched up to
  ``--max-global-batch``, as for a built-in workload), else the config's
  ``train_batch_size``, else what the script trains with now: micro-batch x accumulation
  (its flags, or its config's values) x ranks. A flag given always wins over the script's
  value, and a note says which value it replaced.
- **Activation checkpointing** is searched only where the script has a flag for it (the
  Hugging Face Trainer's ``--gradient_checkpointing``, or ``--script-arg
  activation_checkpointing=--flag``); without one it is dropped from the space with a note.
- The **memory model** knows nothing of the script's model before its first probe: nothing
  is ruled out by the model until a probe has measured it (:mod:`autotune.memory.script_memory`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.errors import SettingsError
from autotune.script_config import ScriptConfig, flag_value
from autotune.workloads.base import Workload

if TYPE_CHECKING:
    import torch

    from autotune.settings import RunSettings
    from autotune.space import SpaceSpec

# Default --probe-timeout of a script probe: its start (imports, data, model build) is its
# own and cannot be derived from a model autotune has not seen. Generous for a hung script
# to cost at most this.
SCRIPT_PROBE_TIMEOUT_S = 300.0
# A neutral prior for the cost model until the first probe has measured the script's model
# (the cost model's weights are fitted to the probes; the memory model never uses it).
PRIOR_PARAMS = 1_000_000


class ScriptWorkload(Workload):
    """The user's script where a :class:`Workload` is expected: a name, samples (not
    tokens), a global batch. Its model exists only inside the script's ranks."""

    tokens_per_sample = 1

    def __init__(self, script: ScriptConfig, global_batch: int) -> None:
        self.script = script
        self.name = script.name
        self.default_global_batch = global_batch

    def build_model(self) -> torch.nn.Module:
        """A stand-in of :data:`PRIOR_PARAMS` parameters for the cost model's prior."""
        import torch

        return torch.nn.Linear(1000, PRIOR_PARAMS // 1000, bias=False)

    def make_batch(self, micro_batch_size: int, device: torch.device) -> Any:
        raise NotImplementedError("a script makes its own batches")

    def describe(self) -> str:
        args = " ".join(self.script.args)
        kind = "Hugging Face Trainer script" if self.script.kind == "hf" else "script"
        return f"{kind} {self.script.name}" + (f" {args}" if args else "")


@dataclass
class ScriptInputs:
    """What planning a script study adds to (or changes in) a workload's resolved."""

    workload: ScriptWorkload
    base: dict[str, Any] | None
    global_batch: int | None  # None: searched (--global-batch auto)
    space: SpaceSpec
    notes: list[str] = field(default_factory=list)
    probe_timeout_s: float = SCRIPT_PROBE_TIMEOUT_S


def script_inputs(settings: RunSettings, space: SpaceSpec, ranks: int) -> ScriptInputs:
    """The base config, global batch, space and notes of a script study."""
    from pathlib import Path

    from autotune.space import load_base_config

    script = settings.script
    assert script is not None
    source = settings.base_config or (Path(script.config_path) if script.config_path else None)
    base = load_base_config(source) if source is not None else None
    notes = []
    if base is not None:
        pinned = _searched_keys(base)
        if pinned:
            notes.append(
                f"{script.name}'s config sets {', '.join(pinned)}: the search varies them "
                "(its other keys are kept as they are)"
            )
    global_batch = _global_batch(settings, script, base or {}, ranks, notes)
    space = _checkpointing_the_script_takes(space, script, notes)
    return ScriptInputs(
        workload=ScriptWorkload(script, global_batch or settings.limits.max_global_batch or 1),
        base=base,
        global_batch=global_batch,
        space=space,
        notes=notes,
        probe_timeout_s=settings.probe.probe_timeout_s or SCRIPT_PROBE_TIMEOUT_S,
    )


def _searched_keys(base: dict[str, Any]) -> list[str]:
    keys = [
        k
        for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
        if base.get(k) not in (None, "auto")
    ]
    keys += [f"{p}.enabled" for p in ("fp16", "bf16") if (base.get(p) or {}).get("enabled") is True]
    zero = base.get("zero_optimization") or {}
    if zero.get("stage") not in (None, "auto"):
        keys.append("zero_optimization.stage")
    keys += [f"zero_optimization.{b}" for b in ("offload_optimizer", "offload_param") if b in zero]
    return keys


def _global_batch(
    settings: RunSettings,
    script: ScriptConfig,
    base: dict[str, Any],
    ranks: int,
    notes: list[str],
) -> int | None:
    """--global-batch (None for ``auto``: searched), else the config's train_batch_size,
    else what the script runs now; a note where the flag replaces the config's value."""
    pinned = base.get("train_batch_size")
    pinned = pinned if isinstance(pinned, int) and pinned > 0 else None
    given = settings.limits.global_batch
    if given is not None and pinned is not None and given != pinned:
        notes.append(
            f"--global-batch {given} replaces the train_batch_size {pinned} of "
            f"{script.name}'s config"
        )
    if given == "auto":
        return None
    if isinstance(given, int):
        return given
    if pinned is not None:
        return pinned
    micro = _int(flag_value(script.args, script.flags.get("micro_batch_size", "")))
    micro = micro or _int(base.get("train_micro_batch_size_per_gpu"))
    accumulation = _int(
        flag_value(script.args, script.flags.get("gradient_accumulation_steps", ""))
    )
    accumulation = accumulation or _int(base.get("gradient_accumulation_steps")) or 1
    if script.kind == "hf":
        micro = micro or 8  # TrainingArguments.per_device_train_batch_size's default
    if micro is None:
        raise SettingsError(
            f"--global-batch: {script.name}'s config fixes no batch (train_batch_size or "
            "train_micro_batch_size_per_gpu) and no batch flag is mapped; give --global-batch N"
        )
    return micro * accumulation * ranks


def _int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _checkpointing_the_script_takes(
    space: SpaceSpec, script: ScriptConfig, notes: list[str]
) -> SpaceSpec:
    """``space`` less the checkpointing ``script`` has no flag for, each drop a note: a
    share of its blocks needs ``--script-arg checkpoint_fraction=--flag`` (the script counts
    and wraps its blocks), all of them ``activation_checkpointing=--flag`` (or the share's
    flag)."""
    if "selective" in (space.checkpoint_policy or ()):
        notes.append(
            f"checkpoint_policy selective dropped: {script.name} recomputes as its own code "
            "says (autotune cannot reach a script's checkpointing policy)"
        )
        space = space.model_copy(update={"checkpoint_policy": ["full"]})
    fractions = space.checkpointing_fractions
    if "checkpoint_fraction" in script.flags:
        return space
    kept = [f for f in fractions if f in (0, 1)]
    partial = [f for f in fractions if 0 < f < 1]
    if partial:
        notes.append(
            f"{script.name} has no flag for a share of its blocks to recompute: "
            f"checkpoint_fraction {', '.join(f'{f:g}' for f in partial)} dropped from the space "
            "(name one with --script-arg checkpoint_fraction=--flag)"
        )
    if 1 in kept and "activation_checkpointing" not in script.flags:
        kept.remove(1)
        notes.append(
            f"{script.name} has no flag for activation checkpointing: checkpointing dropped "
            "from the space (name one with --script-arg activation_checkpointing=--flag)"
        )
    return space.with_checkpointing(kept or [0.0]) if kept != fractions else space
