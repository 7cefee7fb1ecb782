"""What tracing and building a model teach, kept on disk between runs, for workloads that
can name their model.

Tracing a model on fake tensors (:mod:`autotune.memory.activations`) takes a noticeable
time even on a small model and much more on a large one, and a study traces every
micro-batch x precision x checkpointing combination of its space before its first probe (to
screen the space): seconds of every ``autotune run`` of gpt-tiny, again at every
continuation, ``plan`` and test (benchmarks/RESULTS.md, "Start and end of a run and of a
probe launch"). The parameter counts (:func:`autotune.memory.model_facts`) need the model
built on the meta device, which imports the model's code. Both depend only
on the model's shapes (:meth:`Workload.trace_fingerprint`), the library versions that build
and run it, and the code that traces and counts, so they are kept under that key in
``<cache>/activations/`` and read back by later runs: a run of a known model does not build
it in the driver at all. A workload without a fingerprint (a user's factory) is traced and
built in every process.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import os
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from autotune.cache_dir import cache_root

if TYPE_CHECKING:
    from autotune.workloads import Workload

Record = TypeVar("Record", bound=BaseModel)

# Libraries whose versions change what a trace sees (model code, operators).
LIBRARIES = ("torch", "transformers", "diffusers")
# The code that traces, counts and defines the workloads: a change to any of it is a new key.
TRACING_MODULES = (
    "autotune.memory.activations",
    "autotune.memory._cuda_kernels",
    "autotune.probe._memtrack",
    "autotune.memory.memory_model",
    "autotune.backends._memory_terms",
    "autotune.workloads.base",
    "autotune.workloads.checkpointing",
    "autotune.workloads.activation_offload",
    "autotune.workloads.blocks",
)
# Each file (by path) read once per process; what this process stores is added to its copy.
_read: dict[str, dict[str, Any]] = {}


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


def entry_name(
    micro_batch_size: int,
    dtype_name: str,
    checkpointing: bool | tuple[int, int],
    kind: str,
    target: str,
    policy: str = "full",
    offload: str = "none",
) -> str:
    """The name an activation profile is kept under in its model's file: a trace of CUDA's
    kernels (``target`` ``cuda``) is another entry than one of the CPU's. ``checkpointing``:
    every block recomputed or none, or (recomputed, of blocks); ``policy`` selective adds
    ``sel`` to the mode, an ``offload`` of the kept blocks' activations ``act`` and its
    target (``actcpu``)."""
    if isinstance(checkpointing, tuple):
        mode = f"ckpt{checkpointing[0]}of{checkpointing[1]}"
    else:
        mode = "ckpt" if checkpointing else "full"
    if policy != "full":
        mode += "sel"
    if offload != "none":
        mode += f"act{offload}"
    return f"mb{micro_batch_size}-{dtype_name}-{mode}-{kind}-{target}"


def facts_name(persistence_threshold: int) -> str:
    """The name the parameter counts (at a ZeRO-3 persistence threshold) are kept under."""
    return f"facts-units-{persistence_threshold}"


def _from_disk(key: str) -> dict[str, Any]:
    try:
        data = json.loads(_path(key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def load(key: str) -> dict[str, Any]:
    """The entries kept under ``key`` (empty where none are, or the file is damaged), read
    from disk once per process."""
    path = str(_path(key))
    if path not in _read:
        _read[path] = _from_disk(key)
    return _read[path]


def store(key: str, name: str, record: BaseModel) -> None:
    """Add one entry to those kept under ``key``; the file is replaced whole, merged with
    what other processes stored meanwhile (two storing at once may drop one's entry: it is
    traced again next time)."""
    path = _path(key)
    entries: dict[str, Any] = {**load(key), **_from_disk(key)}
    entries[name] = record.model_dump()
    _read[str(path)] = entries
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(entries, sort_keys=True), encoding="utf-8")
        os.replace(temporary, path)


def kept_or_made(
    workload: Workload, name: str, record_type: type[Record], make: Callable[[], Record]
) -> Record:
    """The record kept under the workload's key and ``name``, else ``make()``'s, which is
    kept for later runs where the workload has a key (a damaged entry is made again)."""
    key = cache_key(workload)
    if key is not None:
        with contextlib.suppress(ValidationError):
            return record_type.model_validate(load(key).get(name))
    made = make()
    if key is not None:
        store(key, name, made)
    return made
