"""The CPU peak-memory tracker: counts live storages once, frees, enforces a limit."""

from __future__ import annotations

import gc

import pytest
import torch

from autotune.probe._memtrack import TensorMemoryTracker


def test_counts_each_storage_once_and_releases() -> None:
    with TensorMemoryTracker() as tracker:
        a = torch.zeros(1024, dtype=torch.float32)  # 4 KiB
        view = a.view(32, 32)  # same storage: not counted again
        b = a + 1  # a new 4 KiB storage
        assert tracker.live_bytes == 8192
        del b
        gc.collect()
        assert tracker.live_bytes == 4096
        c = torch.empty(256, dtype=torch.bfloat16)  # 512 B
        assert tracker.live_bytes == 4096 + 512
    assert tracker.peak_bytes == 8192
    del a, view, c


def test_a_storage_resized_in_place_is_freed_and_allocated_again() -> None:
    """FSDP2 frees a unit's unsharded parameters with ``UntypedStorage.resize_(0)`` and
    re-allocates them with ``resize_(n)``, calls that never reach the dispatcher."""
    original = torch.UntypedStorage.resize_
    with TensorMemoryTracker() as tracker:
        held = torch.empty(1024, dtype=torch.float32)  # 4 KiB
        storage = held.untyped_storage()
        storage.resize_(0)
        assert tracker.live_bytes == 0
        storage.resize_(4096)
        storage.resize_(0)
        storage.resize_(4096)
        assert tracker.live_bytes == 4096 and tracker.peak_bytes == 4096
        elsewhere = torch.UntypedStorage(0)  # made outside any operator: counted once grown
        elsewhere.resize_(2048)
        assert tracker.live_bytes == 4096 + 2048
        del elsewhere
        gc.collect()
        assert tracker.live_bytes == 4096
    assert torch.UntypedStorage.resize_ is original  # unwrapped with the last tracker
    storage.resize_(0)  # after the tracker: nothing counts it
    assert tracker.live_bytes == 4096
    del held, storage


def test_a_dtensor_counts_its_local_shard_not_its_global_size() -> None:
    """A DTensor's own storage reports the global tensor's size but holds nothing: FSDP2's
    optimizer states and gradients are DTensors, and a rank holds only their shards."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    # two ranks in this one process: the fake process group runs no collective
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        weight = distribute_tensor(torch.empty(256, 64), mesh, [Shard(0)])  # 64 KiB whole
        assert weight.to_local().shape == (128, 64)
        with TensorMemoryTracker() as tracker:
            state = torch.zeros_like(weight)  # AdamW's state of a sharded parameter
            assert tracker.live_bytes == 128 * 64 * 4
            del state
            gc.collect()
            assert tracker.live_bytes == 0
            tracker.adopt([weight])
            assert tracker.live_bytes == 128 * 64 * 4
    finally:
        dist.destroy_process_group()


def test_peak_covers_autograd_intermediates() -> None:
    layer = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256)
    with TensorMemoryTracker() as tracker:
        loss = layer(x).relu().sum()
        loss.backward()
    # output (64x256 fp32 = 64 KiB) and relu output are live together before backward
    assert tracker.peak_bytes >= 2 * 64 * 256 * 4
    assert tracker.live_bytes < tracker.peak_bytes


def test_limit_raises_out_of_memory() -> None:
    with (
        pytest.raises(torch.OutOfMemoryError, match="exceeds the limit of 1000 bytes"),
        TensorMemoryTracker(limit_bytes=1000),
    ):
        torch.zeros(1000, dtype=torch.float32)


def test_reset_peak() -> None:
    with TensorMemoryTracker() as tracker:
        big = torch.zeros(4096)
        del big
        gc.collect()
        tracker.reset_peak()
        small = torch.zeros(16)
    assert tracker.peak_bytes == 64
    del small


def test_live_tensors_and_adopt_count_what_was_alive_before() -> None:
    """A warm rank's tracker starts from what is still alive, as a device allocator would:
    a tensor an earlier candidate left counts in the peak, and its release is subtracted."""
    from autotune.probe._memtrack import live_tensors, storage_bytes

    gc.collect()
    before = storage_bytes(live_tensors("cpu"))
    left_over = torch.zeros(4096)  # 16 KiB, made before the tracker
    view = left_over[:10]  # same storage: counted once
    assert storage_bytes(live_tensors("cpu")) - before == 16384
    with TensorMemoryTracker() as tracker:
        tracker.adopt(live_tensors("cpu"))
        assert tracker.live_bytes == before + 16384
        doubled = view * 2  # 40 B of its own; the view's storage is not counted again
        assert tracker.live_bytes == before + 16384 + 40
        del left_over, view
        gc.collect()
        assert tracker.live_bytes == before + 40
    assert tracker.peak_bytes == before + 16384 + 40
    del doubled


FROZEN_HEAP = """
import gc, weakref
import torch
from autotune.probe._memtrack import freeze_heap, live_tensors, storage_bytes

kept = torch.zeros(1024, dtype=torch.uint8)       # alive when the heap is frozen
dropped = torch.zeros(2048, dtype=torch.uint8)    # frozen, then dropped
gone = weakref.ref(dropped)
gc.collect()
freeze_heap()
assert len(gc.get_objects()) < 1000, len(gc.get_objects())  # the collector skips the heap
made_after = torch.zeros(4096, dtype=torch.uint8)
found = {t.untyped_storage().data_ptr() for t in live_tensors("cpu")}
assert kept.data_ptr() in found and made_after.data_ptr() in found
assert dropped.data_ptr() in found
del dropped
assert gone() is None  # a weak reference: the freeze keeps nothing alive
sizes = storage_bytes(live_tensors("cpu"))
assert 1024 + 4096 <= sizes < 1024 + 4096 + 2048, sizes
print("ok")
"""


def test_a_frozen_heap_is_skipped_by_the_collector_but_its_tensors_are_still_seen() -> None:
    """In a fresh interpreter: freezing the test process's own heap would outlive the test."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FROZEN_HEAP], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
