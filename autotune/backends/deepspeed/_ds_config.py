"""DeepSpeed config files as a candidate's probe and the export hand them over."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.script_config import ScriptConfig


def script_ds_config(config: dict[str, Any], script: ScriptConfig) -> dict[str, Any]:
    """The config file a script is given for a candidate (probes and the export).

    For the Hugging Face Trainer ``train_batch_size`` is left out: the Trainer checks an
    explicit value against its own world size, which it takes as 1 on CPU ranks (and an
    "auto" it resolves the same way fails DeepSpeed's batch assertion); DeepSpeed derives it
    from the explicit micro-batch and accumulation times the ranks. Probes make it explicit
    again at ``deepspeed.initialize``.
    """
    if script.kind != "hf":
        return config
    return {k: v for k, v in config.items() if k != "train_batch_size"}
