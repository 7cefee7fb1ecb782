"""Any local Hugging Face config as a workload: ``hf:path/to/config.json`` (or a folder
holding ``config.json``), with options ``?seq=N&batch=N&head=causal|masked``. The model is
built from the config with random weights: nothing is downloaded, and nothing the config
names is executed (``auto_map`` remote code is refused)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import WorkloadError
from autotune.workloads.transformers_lm import CausalLMWorkload, MaskedLMWorkload, first_attr

if TYPE_CHECKING:
    from transformers import PretrainedConfig

HF_PREFIX = "hf:"
HF_OPTIONS = {
    "seq": "sequence length (tokens per sample)",
    "batch": "default global batch",
    "head": "causal or masked (default: from the config's architectures)",
}
HF_DEFAULT_SEQ = 2048  # at most; less when the config's positions are fewer
HF_DEFAULT_BATCH = 32


@dataclass(frozen=True)
class _ConfigFile:
    """A config read from a local ``config.json`` (equal by path and content, so two
    references to the same file share the memory model's traces)."""

    path: str
    text: str

    def __call__(self) -> PretrainedConfig:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        data = json.loads(self.text)
        return CONFIG_MAPPING[data["model_type"]].from_dict(data)


def split_hf_ref(ref: str) -> tuple[str, dict[str, str]]:
    """``hf:PATH?key=value&...`` -> (PATH, options)."""
    body = ref[len(HF_PREFIX) :]
    path, _, query = body.partition("?")
    options: dict[str, str] = {}
    for item in filter(None, query.split("&")):
        key, sep, value = item.partition("=")
        if not sep or key not in HF_OPTIONS:
            raise WorkloadError(
                f"workload {ref!r}: cannot read option {item!r}; give seq=N, batch=N or "
                "head=causal|masked, e.g. 'hf:path/config.json?seq=512&batch=32'"
            )
        options[key] = value
    return path, options


def hf_config_path(path: str) -> Path:
    """The config file a ``hf:`` path names: the file, or ``config.json`` in the folder."""
    candidate = Path(path).expanduser()
    return candidate / "config.json" if candidate.is_dir() else candidate


def hf_study_name(ref: str) -> str:
    """``hf:models/my-llama/config.json?seq=512`` -> ``my-llama-seq512``."""
    path, options = split_hf_ref(ref)
    file = hf_config_path(path)
    stem = file.parent.name if file.name == "config.json" else file.stem
    return "-".join([stem or "hf", *(f"{k}{v}" for k, v in sorted(options.items()))])


def _int_option(ref: str, options: dict[str, str], key: str, default: int) -> int:
    if key not in options:
        return default
    try:
        value = int(options[key])
    except ValueError:
        value = 0
    if value < 1:
        raise WorkloadError(f"workload {ref!r}: {key}={options[key]!r} is not a positive integer")
    return value


def hf_config_workload(ref: str) -> CausalLMWorkload:
    """The model a local ``config.json`` describes, with random weights (nothing is
    downloaded, and nothing from the config is executed)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path, options = split_hf_ref(ref)
    file = hf_config_path(path)
    if not path or not file.is_file():
        raise WorkloadError(
            f"workload {ref!r}: no config file at {file}; give hf:path/to/config.json or "
            "hf:path/to/folder holding config.json"
        )
    text = file.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"workload {ref!r}: {file} is not JSON ({exc}); fix the file") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"workload {ref!r}: {file} holds no JSON object; fix the file")
    if data.get("auto_map") or data.get("trust_remote_code"):
        raise WorkloadError(
            f"workload {ref!r}: the config needs remote code (auto_map), which autotune does "
            "not run; use a transformers architecture or write a workload "
            "(path/to/file.py:function)"
        )
    head, model_type = _hf_head(ref, data, options.get("head"))
    make_config = _ConfigFile(str(file.resolve()), text)
    try:
        config = make_config()
    except Exception as exc:  # a config transformers rejects: the user's file to fix
        raise WorkloadError(
            f"workload {ref!r}: transformers cannot read {file} as a {model_type} config: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    positions = first_attr(config, ("max_position_embeddings", "n_positions"))
    seq = _int_option(ref, options, "seq", min(HF_DEFAULT_SEQ, positions or HF_DEFAULT_SEQ))
    if isinstance(positions, int) and seq > positions:
        raise WorkloadError(
            f"workload {ref!r}: seq={seq} exceeds the config's {positions} positions; give a "
            "smaller seq or raise max_position_embeddings in the config"
        )
    batch = _int_option(ref, options, "batch", HF_DEFAULT_BATCH)
    cls = MaskedLMWorkload if head == "masked" else CausalLMWorkload
    return cls(hf_study_name(ref), make_config, seq_len=seq, default_global_batch=batch)


def _hf_head(ref: str, data: dict[str, Any], head: str | None) -> tuple[str, str]:
    """(causal|masked, model_type): from ``head=``, else the config's architectures, else
    the LM heads transformers registers for its model_type."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = data.get("model_type")
    version = transformers.__version__
    if not model_type or model_type not in CONFIG_MAPPING:
        raise WorkloadError(
            f"workload {ref!r}: model_type {model_type!r} is not an architecture transformers "
            f"{version} knows; use a config of a transformers model"
        )
    causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    masked = model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    if head is not None:
        if head not in ("causal", "masked"):
            raise WorkloadError(f"workload {ref!r}: head={head!r}; give head=causal or head=masked")
        if not (causal if head == "causal" else masked):
            raise WorkloadError(
                f"workload {ref!r}: transformers {version} has no {head} LM for {model_type}"
            )
        return head, model_type
    for architecture in data.get("architectures") or []:
        if not hasattr(transformers, architecture):
            raise WorkloadError(
                f"workload {ref!r}: architecture {architecture!r} is not in transformers "
                f"{version}; use a config of a transformers model"
            )
        if architecture in MODEL_FOR_MASKED_LM_MAPPING_NAMES.values():
            return "masked", model_type
        if architecture in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
            return "causal", model_type
    if causal or masked:
        return ("causal" if causal else "masked"), model_type
    raise WorkloadError(
        f"workload {ref!r}: transformers {version} has no causal or masked LM for {model_type}"
    )
