"""Workload registry: built-in names, local Hugging Face configs (``hf:path/config.json``),
and user workloads from ``file.py:fn`` or ``pkg.mod:fn``.

Importing this package does not import torch: the factories do, when called.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from pathlib import Path

from autotune.errors import WorkloadError
from autotune.workloads.base import Workload
from autotune.workloads.dit import DIT_PATCHES, DIT_SIZES, DiTWorkload, dit, dit_tiny
from autotune.workloads.hf_config import (
    HF_PREFIX,
    hf_config_path,
    hf_config_workload,
    hf_study_name,
    split_hf_ref,
)
from autotune.workloads.transformers_lm import (
    CausalLMWorkload,
    MaskedLMWorkload,
    gpt2,
    gpt2_xl,
    gpt_tiny,
    llama3_8b,
    llama3_70b,
    llama_1b,
    llama_7b,
    llama_13b,
    llama_70b,
    mixtral_8x7b,
    moe_tiny,
)

__all__ = [
    "WORKLOADS",
    "CausalLMWorkload",
    "DiTWorkload",
    "MaskedLMWorkload",
    "Workload",
    "absolute_workload_ref",
    "get_workload",
    "workload_study_name",
]

WORKLOADS: dict[str, Callable[[], Workload]] = {
    "gpt-tiny": gpt_tiny,
    "gpt2": gpt2,
    "gpt2-xl": gpt2_xl,
    "llama-1b": llama_1b,
    "llama-7b": llama_7b,
    "llama-13b": llama_13b,
    "llama-70b": llama_70b,
    "llama3-8b": llama3_8b,
    "llama3-70b": llama3_70b,
    "mixtral-8x7b": mixtral_8x7b,
    "moe-tiny": moe_tiny,
    "dit-tiny": dit_tiny,
    # dit-s-2 ... dit-xl-8: the DiT paper's models at 256 px
    **{
        f"dit-{size}-{patch}": functools.partial(dit, size, patch)
        for size in DIT_SIZES
        for patch in DIT_PATCHES
    },
}


def get_workload(ref: str) -> Workload:
    """A built-in name, ``hf:path/to/config.json[?seq=N&batch=N]``, or
    ``path/to/file.py:function`` / ``package.module:function``."""
    if ref in WORKLOADS:
        return WORKLOADS[ref]()
    if ref.startswith(HF_PREFIX):
        return hf_config_workload(ref)
    if ":" not in ref:
        raise WorkloadError(
            f"unknown workload {ref!r}; known: {', '.join(WORKLOADS)}, "
            "or give hf:path/to/config.json, path/to/file.py:function or "
            "package.module:function"
        )
    location, _, attr = ref.rpartition(":")
    module = _import_location(ref, location)
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise WorkloadError(
            f"workload {ref!r}: {location} has no function {attr!r}; define "
            f"`def {attr}() -> autotune.workloads.Workload` there"
        )
    try:
        workload = factory()
    except Exception as exc:  # user code: any failure is the user's to fix
        raise WorkloadError(
            f"workload {ref!r}: calling {attr}() raised {type(exc).__name__}: {exc}"
        ) from exc
    missing = [m for m in ("build_model", "make_batch", "loss") if not hasattr(workload, m)]
    if missing:
        raise WorkloadError(
            f"workload {ref!r}: {attr}() returned {type(workload).__name__}, not a Workload "
            f"(missing {', '.join(missing)}); subclass autotune.workloads.Workload"
        )
    batch = getattr(workload, "default_global_batch", None)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch <= 0:
        raise WorkloadError(
            f"workload {ref!r}: {type(workload).__name__} has no default_global_batch (got "
            f"{batch!r}); set `default_global_batch = 32` (samples per optimizer step) on it, "
            "or pass --global-batch"
        )
    if not hasattr(workload, "tokens_per_sample"):
        workload.tokens_per_sample = 1  # a model without tokens: samples/s only
    if not getattr(workload, "name", None):
        workload.name = attr
    return workload


def _import_location(ref: str, location: str) -> object:
    try:
        if location.endswith(".py") or "/" in location:
            path = Path(location)
            if not path.is_file():
                raise WorkloadError(f"workload {ref!r}: file {location} does not exist")
            module_name = "autotune_user_workload_" + re.sub(r"\W", "_", path.stem)
            spec = importlib.util.spec_from_file_location(module_name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
            return module
        return importlib.import_module(location)
    except WorkloadError:
        raise
    except Exception as exc:  # user code: report what failed, in one line
        raise WorkloadError(
            f"workload {ref!r}: importing {location} failed with {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}; fix the module or the path"
        ) from exc


def workload_study_name(ref: str) -> str:
    """Default study name: the built-in name, the config's folder (or file) name of a
    ``hf:`` config with its options, or a user workload's ``name`` (its factory's name if
    it has none)."""
    if ref in WORKLOADS:
        return ref
    if ref.startswith(HF_PREFIX):
        return hf_study_name(ref)
    return str(getattr(get_workload(ref), "name", "") or ref.rpartition(":")[2])


def absolute_workload_ref(ref: str) -> str:
    """``ref`` with a relative file path made absolute (a user workload file or a ``hf:``
    config), so that probes started in another folder, and a study continued from one,
    find it."""
    if ref in WORKLOADS:
        return ref
    if ref.startswith(HF_PREFIX):
        path, options = split_hf_ref(ref)
        query = "&".join(f"{key}={value}" for key, value in options.items())
        return f"{HF_PREFIX}{hf_config_path(path).resolve()}" + (f"?{query}" if query else "")
    location, sep, attr = ref.rpartition(":")
    if sep and (location.endswith(".py") or "/" in location):
        return f"{Path(location).resolve()}:{attr}"
    return ref
