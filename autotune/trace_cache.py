"""Activation profiles kept on disk between runs, for workloads that can name their model.

Tracing a model on fake tensors (:mod:`autotune.activations`) costs about 0.4 s a trace on a
small model and much more on a large one, and a study traces every micro-batch x precision
x checkpointing combination of its space before its first probe (to screen the space): 6 s
of every ``autotune run`` of gpt-tiny, again at every continuation, ``plan`` and test. The
result depends only on the model's shapes (:meth:`Workload.trace_fingerprint`), the library
versions that build and run it, and the code that traces, so it is kept under that key in
``<cache>/activations/`` and read back by later runs. A workload without a fingerprint (a
user's factory) is traced in every process, as before.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.cpu_info import cache_root

if TYPE_CHECKING:
    from autotune.activations import ActivationProfile
    from autotune.workloads import Workload

# Libraries whose versions change what a trace sees (model code, operators).
LIBRARIES = ("torch", "transformers", "diffusers")
# The code that traces, counts and defines the workloads: a change to any of it is a new key.
TRACING_MODULES = (
    "autotune.activations",
    "autotune.memtrack",
    "autotune.workloads.base",
)


@functools.cache
def _source_digest(module_name: str) -> str:
    path = getattr(importlib.import_module(module_name), "__file__", None)
    if not path:
        return "unknown"
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return "unknown"


@functools.cache
def _versions() -> dict[str, str]:
    found = {}
    for library in LIBRARIES:
        try:
            found[library] = version(library)
        except PackageNotFoundError:
            found[library] = "none"
    return found


def cache_key(workload: Workload) -> str | None:
    """The key a workload's profiles are kept under, or None where it has no fingerprint."""
    fingerprint = workload.trace_fingerprint()
    if fingerprint is None:
        return None
    modules = [*TRACING_MODULES, type(workload).__module__]
    data = {
        "model": fingerprint,
        "versions": _versions(),
        "code": {name: _source_digest(name) for name in modules},
    }
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _path(key: str) -> Path:
    return Path(cache_root()) / "activations" / f"{key}.json"


def entry_name(micro_batch_size: int, dtype_name: str, checkpointing: bool, kind: str) -> str:
    return f"mb{micro_batch_size}-{dtype_name}-{'ckpt' if checkpointing else 'full'}-{kind}"


def load(key: str) -> dict[str, dict[str, float]]:
    """The profiles kept under ``key`` (empty where none are, or the file is damaged)."""
    try:
        data = json.loads(_path(key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def store(key: str, name: str, profile: ActivationProfile) -> None:
    """Add one profile to those kept under ``key``; the file is replaced whole (two runs
    storing at once may drop one's entry: it is traced again next time)."""
    path = _path(key)
    entries: dict[str, Any] = load(key)
    entries[name] = profile.model_dump()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(entries, sort_keys=True), encoding="utf-8")
        os.replace(temporary, path)
