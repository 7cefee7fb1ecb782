"""A candidate as a DeepSpeed config: the only code that spells DeepSpeed's JSON keys
(``train_micro_batch_size_per_gpu``, ``zero_optimization``, ``bf16`` ...), and the config
file a script is handed."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from autotune.candidate import ZERO_KNOB_STAGES

if TYPE_CHECKING:
    from autotune.candidate import Candidate
    from autotune.script_config import ScriptConfig

# Used when the user gives no base config: a plain AdamW, quiet logging. The tuned keys are
# laid over it; everything else a user's own base config holds is kept as is.
DEFAULT_BASE_CONFIG: dict[str, Any] = {
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
    "steps_per_print": 1_000_000,
    "wall_clock_breakdown": False,
}

# DeepSpeed's dynamic loss scaling for fp16 (loss_scale 0 = dynamic); see DeepSpeed's
# config-json docs, "FP16 training options". A user's own fp16 block overrides these.
FP16_DYNAMIC_LOSS_SCALING: dict[str, Any] = {
    "enabled": True,
    "loss_scale": 0,
    "initial_scale_power": 16,
    "loss_scale_window": 1000,
    "hysteresis": 2,
    "min_loss_scale": 1,
}


# DeepSpeed's offload_param.buffer_size default (elements): one NVMe swap buffer.
DEFAULT_PARAM_BUFFER_SIZE = 100_000_000
# Keys of an offload block that the candidate decides; a base config's other keys
# (pin_memory, buffer_count, buffer_size, max_in_cpu ...) are production tuning and kept.
_OFFLOAD_TUNED_KEYS = ("device", "nvme_path", "ratio")


def render_ds_config(
    candidate: Candidate,
    base: dict[str, Any] | None = None,
    *,
    nvme_path: str | None = None,
    largest_param_numel: int | None = None,
) -> dict[str, Any]:
    """The base config with the candidate's tuned keys laid over it.

    ``largest_param_numel``: elements of the model's largest parameter (an upper bound
    such as ``memory.largest_layer_params`` will do). With parameter offload to NVMe,
    ``offload_param.buffer_size`` is raised to at least that parameter's partition on
    one rank: DeepSpeed swaps each partition through one buffer and asserts it fits.
    """
    config = copy.deepcopy(DEFAULT_BASE_CONFIG if base is None else base)
    config["train_batch_size"] = candidate.train_batch_size
    config["train_micro_batch_size_per_gpu"] = candidate.micro_batch_size
    config["gradient_accumulation_steps"] = candidate.gradient_accumulation_steps
    # Checkpointing and activation offload live in the model's code, not here: DeepSpeed's
    # ``activation_checkpointing`` section (``cpu_checkpointing`` among it) acts only on a
    # model that calls ``deepspeed.checkpointing.checkpoint``, which the probes' models do
    # not, and it moves the recomputed blocks' inputs, not the kept blocks' activations.

    fp16 = dict(config.get("fp16") or {})
    bf16 = dict(config.get("bf16") or {})
    if candidate.precision == "fp16":
        fp16 = {**FP16_DYNAMIC_LOSS_SCALING, **fp16, "enabled": True}
    else:
        fp16 = {**fp16, "enabled": False}
    bf16 = {**bf16, "enabled": candidate.precision == "bf16"}
    config["fp16"], config["bf16"] = fp16, bf16

    zero = dict(config.get("zero_optimization") or {})
    zero["stage"] = candidate.zero_stage
    base_optimizer = zero.pop("offload_optimizer", None)
    base_param = zero.pop("offload_param", None)
    if candidate.offload_optimizer != "none":
        block = _offload_block(candidate.offload_optimizer, nvme_path, base_optimizer)
        if candidate.offload_optimizer_ratio < 1.0:
            block["ratio"] = candidate.offload_optimizer_ratio
        zero["offload_optimizer"] = block
    if candidate.offload_param != "none":
        block = _offload_block(candidate.offload_param, nvme_path, base_param)
        size = block.get("buffer_size", DEFAULT_PARAM_BUFFER_SIZE)
        numeric = isinstance(size, (int, float))  # a JSON base may write 1e8
        if candidate.offload_param == "nvme" and largest_param_numel and numeric:
            partition = -(-largest_param_numel // candidate.data_parallel_size)
            block["buffer_size"] = max(int(size), partition)
        zero["offload_param"] = block
    for name, value in candidate.zero_knobs.items():
        if candidate.zero_stage in ZERO_KNOB_STAGES[name]:
            zero[name] = value
    config["zero_optimization"] = zero
    return config


def _offload_block(device: str, nvme_path: str | None, base: Any = None) -> dict[str, Any]:
    kept = {k: v for k, v in (base or {}).items() if k not in _OFFLOAD_TUNED_KEYS}
    block: dict[str, Any] = {"pin_memory": True, **kept, "device": device}
    if device == "nvme":
        if not nvme_path:
            raise ValueError("nvme offload needs an nvme_path")
        block["nvme_path"] = nvme_path
    return block


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
