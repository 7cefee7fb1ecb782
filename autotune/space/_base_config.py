"""The user's production DeepSpeed config (``--base-config``): loading and conflict checks.

autotune lays its tuned keys over the base config and keeps everything else (optimizer,
scheduler, clipping, logging ...). A base config that pins a value the search varies would
be silently overridden, so it is refused before any probe, naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import SettingsError

if TYPE_CHECKING:
    from autotune.space.search_space import BoundSpace


def load_base_config(path: Path) -> dict[str, Any]:
    """Read a DeepSpeed JSON config; one error line if it is missing or not a JSON object."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"--base-config {path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise SettingsError(
            f"--base-config {path}: not UTF-8 text (byte {exc.start}); give a DeepSpeed JSON "
            "config saved as UTF-8"
        ) from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(
            f"--base-config {path}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
            f"{exc.msg}); give a DeepSpeed JSON config"
        ) from None
    if not isinstance(config, dict):
        raise SettingsError(
            f"--base-config {path}: a DeepSpeed config is a JSON object, got "
            f"{type(config).__name__}"
        )
    check_blocks(config, str(path))
    return config


# Sections of a DeepSpeed config that are objects (DeepSpeed's config-json docs), with an
# example each; a scalar there (``"fp16": true``) is a typo DeepSpeed would only report deep
# inside a probe.
OBJECT_SECTIONS = {
    "fp16": '"fp16": {"enabled": true}',
    "bf16": '"bf16": {"enabled": true}',
    "zero_optimization": '"zero_optimization": {"stage": 3}',
    "optimizer": '"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}',
    "scheduler": '"scheduler": {"type": "WarmupLR", "params": {}}',
}
ZERO_OBJECTS = ("offload_optimizer", "offload_param")


def check_blocks(config: dict[str, Any], source: str) -> None:
    """Refuse a section that must be a JSON object but is not, naming it and the fix."""
    for key, example in OBJECT_SECTIONS.items():
        if key in config and not isinstance(config[key], dict):
            raise SettingsError(
                f"--base-config {source}: {key!r} must be an object, e.g. {example}, got "
                f"{config[key]!r}"
            )
    zero = config.get("zero_optimization") or {}
    for key in ZERO_OBJECTS:
        if key in zero and not isinstance(zero[key], dict):
            raise SettingsError(
                f"--base-config {source}: zero_optimization.{key} must be an object, e.g. "
                f'{{"device": "cpu"}}, got {zero[key]!r}'
            )


def base_global_batch(base: dict[str, Any], flag: int | None, source: str) -> int | None:
    """The global batch: the flag, else the base's ``train_batch_size``; they must agree."""
    pinned = base.get("train_batch_size")
    if pinned in (None, "auto"):
        return flag
    if flag is not None and pinned != flag:
        raise SettingsError(
            f"--base-config {source} pins train_batch_size = {pinned} but --global-batch is "
            f"{flag}; remove train_batch_size from the base config or pass --global-batch "
            f"{pinned}"
        )
    if not isinstance(pinned, int) or pinned <= 0:
        raise SettingsError(
            f"--base-config {source}: train_batch_size must be a positive integer, got {pinned!r}"
        )
    return pinned


def _pinned_values(base: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Dimension -> (key path in the base config, pinned value), for what the base pins."""
    pinned: dict[str, tuple[str, Any]] = {}
    for key, dimension in (
        ("train_micro_batch_size_per_gpu", "micro_batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ):
        if base.get(key) not in (None, "auto"):
            pinned[dimension] = (key, base[key])
    fp16 = (base.get("fp16") or {}).get("enabled")
    bf16 = (base.get("bf16") or {}).get("enabled")
    if fp16 is True:
        pinned["precision"] = ("fp16.enabled", "fp16")
    elif bf16 is True:
        pinned["precision"] = ("bf16.enabled", "bf16")
    zero = base.get("zero_optimization") or {}
    if zero.get("stage") not in (None, "auto"):
        pinned["zero_stage"] = ("zero_optimization.stage", zero["stage"])
    for block, dimension in (
        ("offload_optimizer", "offload_optimizer"),
        ("offload_param", "offload_param"),
    ):
        device = (zero.get(block) or {}).get("device")
        if device not in (None, "auto"):
            pinned[dimension] = (f"zero_optimization.{block}.device", device)
    ratio = (zero.get("offload_optimizer") or {}).get("ratio")
    if ratio is not None:
        pinned["offload_optimizer_ratio"] = ("zero_optimization.offload_optimizer.ratio", ratio)
    for knob, value in zero.items():
        if not isinstance(value, dict) and value != "auto":
            pinned[f"zero.{knob}"] = (f"zero_optimization.{knob}", value)
    return pinned


def check_conflicts(base: dict[str, Any], space: BoundSpace, source: str) -> None:
    """Refuse a base config that pins a value the space varies (or never takes)."""
    searched: dict[str, set[Any]] = {}
    for candidate in space.candidates():
        values = candidate.dimension_values()
        for name, value in values.items():
            searched.setdefault(name, set()).add(value)
    for dimension, (key, value) in _pinned_values(base).items():
        if dimension not in searched:
            continue  # a knob the space does not tune: the base's value is kept
        values = searched[dimension]
        if values != {value}:
            shown = sorted(values, key=str)
            raise SettingsError(
                f"--base-config {source} pins {key} = {value!r}, which the search varies "
                f"({dimension} in {shown}); remove {key} from the base config, or restrict "
                f"{dimension} to [{value}] in the space"
            )


def find_auto_values(config: Any, path: str = "") -> list[str]:
    """Key paths whose value is the string "auto" (Hugging Face Trainer placeholders)."""
    if isinstance(config, dict):
        found = []
        for key, value in config.items():
            found += find_auto_values(value, f"{path}.{key}" if path else str(key))
        return found
    if isinstance(config, list):
        return [p for i, item in enumerate(config) for p in find_auto_values(item, f"{path}[{i}]")]
    return [path] if config == "auto" else []
