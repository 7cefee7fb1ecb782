"""A probe rank's memory: the limit it runs under, what it leaves behind, what running out
of it means.

- The limit on CUDA is :mod:`autotune.probe._cuda_memory`'s.
- Leaks: ranks that probe several candidates check at each start that nothing of the
  earlier ones is still allocated, and release everything (device cache, pinned host
  cache, heap) once a candidate's engine is gone.
- Failures: a device OOM is ``oom``; a failed pinned host allocation, which reads "CUDA
  error: out of memory" too, is an ``error`` of host memory.

Heavy imports (torch, deepspeed) stay inside functions.
"""

from __future__ import annotations

import contextlib
import traceback
from types import TracebackType
from typing import Any

from autotune.protocol import RankStatus

OOM_MARKERS = ("out of memory", "outofmemoryerror")

# A failed page-locked (pinned) host allocation also reads "CUDA error: out of memory", but
# it is host RAM or the locked-memory limit that ran out, not the device's memory: filing it
# as an OOM would rule out larger micro-batches for the wrong reason.
PINNED_MARKERS = ("cudahostalloc", "cudahostregister", "pinned memory", "page-locked")

# Names in the innermost Python frame of a pinned allocation: DeepSpeed's accelerator hooks
# (_torch_pin_memory, _torch_empty_pinned), Tensor.pin_memory(), pin_memory=True.
PINNED_CALLS = ("pin_memory", "pinned")

# Memory of earlier candidates a warm rank may still hold and probe on anyway: 1% of the
# limit, at least 64 MiB (library caches and workspaces made lazily, small globals).
LEAK_TOLERANCE_SHARE = 0.01
LEAK_TOLERANCE_MIN_BYTES = 64 * 2**20

# Bytes each accelerator held at this process's first candidate: the clean baseline.
_FIRST_HELD: dict[str, int] = {}


def pinned_host_failure(exc: BaseException) -> bool:
    """A failed pinned host allocation (``cudaHostAlloc``, ``pin_memory``): host memory, not
    the device's. The device allocator's own OOM (``torch.OutOfMemoryError``) never is."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return False
    text = f"{type(exc).__name__}: {exc}".lower()
    if any(marker in text for marker in PINNED_MARKERS):
        return True
    return "out of memory" in text and _raised_by_pin_memory(exc.__traceback__)


def _raised_by_pin_memory(tb: TracebackType | None) -> bool:
    """The innermost Python frame pins host memory: its function or its failing line names
    ``pin_memory`` or ``pinned`` (the CUDA call below it leaves no Python frame)."""
    frames = traceback.extract_tb(tb)
    if not frames:
        return False
    innermost = frames[-1]
    return any(call in f"{innermost.name} {innermost.line or ''}" for call in PINNED_CALLS)


def is_oom(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or an OOM another layer wrapped into a RuntimeError; not a
    failed pinned host allocation."""
    import torch

    if pinned_host_failure(exc):
        return False
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(marker in text for marker in OOM_MARKERS)


def classify_failure(exc: BaseException) -> tuple[RankStatus, str]:
    """The rank's status and one-line error for an exception its probe raised."""
    if pinned_host_failure(exc):
        return "error", (
            "pinned host memory allocation failed (host RAM or the locked-memory limit, "
            f"ulimit -l; not device memory): {first_line(exc)}"
        )[:500]
    return ("oom" if is_oom(exc) else "error"), first_line(exc)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


def leak_tolerance_bytes(limit_bytes: int) -> int:
    return max(LEAK_TOLERANCE_MIN_BYTES, int(LEAK_TOLERANCE_SHARE * limit_bytes))


def held_bytes(device: Any) -> int:
    """Memory this process holds on its device after a full collection: the CUDA allocator's
    allocated bytes, or on CPU the bytes of every live tensor storage."""
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    from autotune.probe._memtrack import live_tensors, storage_bytes

    return storage_bytes(live_tensors("cpu"))


def leaked_bytes(device: Any) -> int:
    """Bytes held now beyond what this process held at its first candidate, the largest over
    the ranks (all ranks must agree whether to go on: a rank that left would hang its peers
    in the next collective)."""
    held = held_bytes(device)
    return agreed_max(max(0, held - _FIRST_HELD.setdefault(device.type, held)), device)


def agreed_max(value: int, device: Any) -> int:
    """The largest ``value`` over the process group's ranks (``value`` without a group)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return value
    agreed = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return int(agreed.item())


def pinned_host_bytes(device: Any) -> int:
    """Pinned host memory PyTorch's caching host allocator holds (CUDA; 0 elsewhere or on a
    torch without host statistics)."""
    import torch

    stats = getattr(torch.cuda, "host_memory_stats", None)
    if device.type != "cuda" or stats is None:
        return 0
    return int(stats().get("allocated_bytes.current", 0))


def dismantle(engine: Any, model: Any) -> None:
    """Drop what a destroyed engine still holds, however its objects live on: DeepSpeed's
    ZeRO-3 objects stay reachable after ``destroy()`` (from outside Python's collector: a
    warm rank kept the model states, and the next candidate's peak read high), so their
    attributes are cleared and every parameter's storage, ZeRO-3's
    partition included, is freed whatever still points at the parameter."""
    import torch

    optimizer = getattr(engine, "optimizer", None)
    for holder in (getattr(optimizer, "optimizer", None), optimizer, engine):
        if holder is not None and hasattr(holder, "__dict__"):
            holder.__dict__.clear()
    empty = torch.empty(0)
    for param in model.parameters():
        for name in ("ds_tensor", "grad", "_z3_optimizer"):
            if getattr(param, name, None) is not None:
                with contextlib.suppress(AttributeError, RuntimeError, TypeError):
                    setattr(param, name, None)
        param.data = empty


def release(accelerator: str) -> None:
    """Free what a candidate left, once the frame that held its engine is gone: collect the
    reference cycles DeepSpeed's hooks form, then hand cached device memory and pinned host
    memory back and reset the peak counters, so the next candidate starts from nothing."""
    import gc

    import torch

    gc.collect()
    if gc.get_freeze_count() == 0:
        # after the first candidate every import is done: later collections skip that heap
        from autotune.probe._memtrack import freeze_heap

        freeze_heap()
    if accelerator == "cuda":
        # cuBLAS keeps a workspace per handle and stream in the caching allocator; made
        # again on first use, they would otherwise read as what the candidate left
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()
        empty_host_cache()
        torch.cuda.reset_peak_memory_stats()
    trim_host_heap()


def empty_host_cache() -> bool:
    """Release PyTorch's cached pinned host memory (``empty_cache`` does not): offloading
    candidates would otherwise grow a warm rank's host memory candidate after candidate.
    ``torch.accelerator.empty_host_cache`` where torch has it, else the private hook of
    older releases; False where neither exists."""
    import torch

    accelerator = getattr(torch, "accelerator", None)
    empty = getattr(accelerator, "empty_host_cache", None)
    if empty is None:
        empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is None:
        return False
    empty()
    return True


def trim_host_heap() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``): without it a warm
    worker's resident memory ratchets up over candidates of a 124M model until the kernel's
    OOM killer takes a rank (benchmarks/RESULTS.md, "Memory model accuracy")."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        return
