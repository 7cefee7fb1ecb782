"""Peak tensor memory of a CPU rank, where no allocator statistics exist.

CUDA has ``torch.cuda.max_memory_allocated``; the CPU allocator keeps no such counter. A
:class:`TensorMemoryTracker` is a ``TorchDispatchMode`` that sees every tensor an operator
creates, counts the bytes of each distinct storage once, and subtracts them when the storage
is freed (a ``weakref.finalize`` on the storage; PyTorch keeps one Python object per live
storage). This is the same notion of memory as ``torch.distributed._tools.mem_tracker``:
bytes of live tensor storages, which is what a GPU allocator would have to hold. Kernel
workspaces that never surface as tensors are not seen.

A storage resized in place from Python (``UntypedStorage.resize_``, which FSDP2 uses to free
and re-allocate a unit's unsharded parameters around each all-gather) does not pass the
dispatcher; while a tracker is active that method is wrapped, so that the tracker sees the
new size as a free or an allocation, as a device allocator would.

A tensor subclass that wraps others (``DTensor``: one rank's shard of a larger tensor) reports
a storage of its global size that holds no memory; the tracker counts the storages of the
tensors it wraps instead (``__tensor_flatten__``), which hold what the rank allocated.

The tracker can enforce a limit: crossing it raises ``torch.OutOfMemoryError``, like the
CUDA caching allocator does under ``torch.cuda.set_per_process_memory_fraction``.
"""

from __future__ import annotations

import gc
import itertools
import threading
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten


class TensorMemoryTracker(TorchDispatchMode):
    """Live and peak bytes of the CPU tensor storages created while the mode is active."""

    def __init__(self, *, limit_bytes: int | None = None, device_type: str = "cpu") -> None:
        super().__init__()
        self.limit_bytes = limit_bytes
        self.device_type = device_type
        self.live_bytes = 0
        self.peak_bytes = 0
        self._sizes: dict[int, int] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> TensorMemoryTracker:
        _RESIZE_WATCHERS.append(self)
        _wrap_storage_resize()
        try:
            return super().__enter__()
        except BaseException:
            _RESIZE_WATCHERS.remove(self)
            raise

    def __exit__(self, *exc_info: Any) -> None:
        try:
            super().__exit__(*exc_info)
        finally:
            _RESIZE_WATCHERS.remove(self)
            if not _RESIZE_WATCHERS:
                _unwrap_storage_resize()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor) and value.device.type == self.device_type:
                self._track(value)
        return out

    def _track(self, tensor: torch.Tensor) -> None:
        for storage in _storages_of(tensor):
            self._track_storage(storage)

    def _track_storage(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata
        nbytes = storage.nbytes()
        with self._lock:
            known = self._sizes.get(key)
            if known == nbytes:
                return
            # A storage seen before with another size was resized in place (resize_/set_).
            self._sizes[key] = nbytes
            self.live_bytes += nbytes - (known or 0)
            over_limit = self.limit_bytes is not None and self.live_bytes > self.limit_bytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        if known is None:
            weakref.finalize(storage, self._release, key)
        if over_limit:
            raise torch.OutOfMemoryError(
                f"rank tensor memory {self.live_bytes} bytes exceeds the limit of "
                f"{self.limit_bytes} bytes (autotune CPU memory limit)"
            )

    def _resized(self, storage: torch.UntypedStorage) -> None:
        """``storage`` was resized in place: a storage counted before takes its new size
        (0: freed); one not seen before counts from now."""
        if storage.device.type == self.device_type:
            self._track_storage(storage)

    def adopt(self, tensors: Any) -> None:
        """Count the storages of ``tensors`` (alive before the tracker) as live, as a device
        allocator still holds what an earlier candidate left: they are part of this peak,
        and their release is subtracted like any other."""
        for tensor in tensors:
            self._track(tensor)

    def ignore(self, tensors: Any) -> None:
        """Treat the storages of ``tensors`` (made before the tracker) as not ours: views
        of them, such as a weight's transpose, then count nothing."""
        with self._lock:
            for tensor in tensors:
                for storage in _storages_of(tensor):
                    self._sizes.setdefault(storage._cdata, storage.nbytes())

    def _release(self, key: int) -> None:
        with self._lock:
            self.live_bytes -= self._sizes.pop(key, 0)

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_bytes = self.live_bytes


def _storages_of(tensor: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages that hold ``tensor``'s memory: its own, or for a wrapper subclass
    (DTensor) those of the tensors it wraps; none for sparse or storage-less tensors."""
    if is_traceable_wrapper_subclass(tensor):
        inner_names, _ = tensor.__tensor_flatten__()  # type: ignore[attr-defined]
        inner = (getattr(tensor, name) for name in inner_names)  # DTensor's include its mesh
        return [s for t in inner if isinstance(t, torch.Tensor) for s in _storages_of(t)]
    try:
        return [tensor.untyped_storage()]
    except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
        return []


# The active trackers, told of every in-place storage resize made from Python.
_RESIZE_WATCHERS: list[TensorMemoryTracker] = []
_STORAGE_RESIZE = torch.UntypedStorage.resize_


def _watched_resize(storage: torch.UntypedStorage, size: int) -> Any:
    result = _STORAGE_RESIZE(storage, size)
    for tracker in tuple(_RESIZE_WATCHERS):
        tracker._resized(storage)
    return result


def _wrap_storage_resize() -> None:
    torch.UntypedStorage.resize_ = _watched_resize  # type: ignore[method-assign]


def _unwrap_storage_resize() -> None:
    torch.UntypedStorage.resize_ = _STORAGE_RESIZE  # type: ignore[method-assign]


# Tensors alive when the heap was frozen (:func:`freeze_heap`), which the collector no
# longer lists; weak references, so that they die as they would have.
_FROZEN_TENSORS: list[weakref.ref[torch.Tensor]] = []


def freeze_heap() -> None:
    """Move every object alive now into the collector's permanent generation (``gc.freeze``):
    later collections and :func:`live_tensors` walk only the objects made since. A warm
    rank's heap holds the objects of torch, transformers and DeepSpeed, and a full
    collection plus a walk of them, twice per candidate, is a large share of a short
    probe's CPU (benchmarks/RESULTS.md, "Per-probe cost in a warm rank: the frozen heap").
    Call it after a full
    collection, once the process's long-lived objects exist (imports, caches); objects alive
    then that later die in a reference cycle are not collected. :func:`live_tensors` still
    sees the tensors alive now."""
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.Tensor):
            try:
                _FROZEN_TENSORS.append(weakref.ref(obj))
            except TypeError:  # a tensor subclass without weak references
                continue
    gc.freeze()


def live_tensors(device_type: str = "cpu") -> list[torch.Tensor]:
    """One tensor per distinct storage on ``device_type`` that the Python heap holds now
    (call ``gc.collect()`` first to leave out unreachable cycles). Tensors only C++ code
    holds (autograd's saved tensors, communication buffers) are not seen."""
    found: dict[int, torch.Tensor] = {}
    frozen = (ref() for ref in _FROZEN_TENSORS)
    for obj in itertools.chain(gc.get_objects(), frozen):
        # type(), not isinstance(): isinstance reads __class__, which deprecated module
        # attributes (torch.distributed.reduce_op) answer with a warning
        if not issubclass(type(obj), torch.Tensor) or obj.device.type != device_type:
            continue
        try:
            storage = obj.untyped_storage()
            holds_memory = bool(storage.nbytes() and storage.data_ptr())  # not fake or meta
        except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
            continue
        if holds_memory:
            found.setdefault(storage._cdata, obj)
    return list(found.values())


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages of ``tensors``."""
    sizes = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}
    return sum(sizes.values())
