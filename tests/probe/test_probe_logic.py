"""The probe's decisions that CPU tests can check without a GPU: failure classification
(pinned host memory is not a GPU OOM), the CUDA memory-limit arithmetic, DeepSpeed's view of
available memory, fp16 overflow-skipped steps, the device mapping of local slots, and the
torch floor. The CUDA calls themselves are covered by tests/integration/test_gpu_paths.py."""

from __future__ import annotations

import functools
import re
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune import timing as steps
from autotune.backends import get_backend
from autotune.errors import ExecutorError
from autotune.execution._executor import LocalExecutor, slot_devices
from autotune.probe._cuda_memory import (
    allocator_fraction,
    device_overhead_bytes,
    limit_available_memory,
    limited_available_memory,
)
from autotune.probe._rank_memory import (
    classify_failure,
    is_oom,
    leak_tolerance_bytes,
    pinned_host_failure,
)
from autotune.protocol import ProbeSpec
from tests.support.paths import ROOT

GiB = 2**30

# What torch's CUDA builds raise (the texts of torch 2.x's C10_CUDA_CHECK and caching
# allocator); a CPU build cannot raise them, so the tests raise them by hand.
CUDA_ERROR_OOM = (
    "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some "
    "other API call, so the stacktrace below might be incorrect."
)
ALLOCATOR_OOM = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB "
    "of which 1.02 GiB is free."
)

DEEPSPEED = get_backend("deepspeed")


def _spent_generator() -> Iterator[None]:
    yield


def cuda_call_failing(exc: BaseException) -> Callable[..., object]:
    """A C-level callable that raises ``exc`` without a Python frame of its own, as a CUDA
    call inside torch does (a spent generator's ``throw`` re-raises what it is given)."""
    spent = _spent_generator()
    list(spent)
    return functools.partial(spent.throw, exc)


def allocate_swap_buffer(tensor: Any) -> object:
    """Pins inline, as DeepSpeed code does."""
    return tensor.pin_memory()


def _raised(function: object) -> BaseException:
    try:
        function()  # type: ignore[operator]
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc
    raise AssertionError("did not raise")


def test_a_failed_pinned_host_allocation_is_an_error_not_a_gpu_oom() -> None:
    from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator

    host = types.SimpleNamespace(pin_memory=cuda_call_failing(RuntimeError(CUDA_ERROR_OOM)))
    for pinned in (
        _raised(lambda: allocate_swap_buffer(host)),
        # DeepSpeed's own hook, the innermost Python frame of its pinned allocations
        _raised(lambda: DeepSpeedAccelerator._torch_pin_memory(None, host)),
    ):
        assert pinned_host_failure(pinned) and not is_oom(pinned)
        status, error = classify_failure(pinned)
        assert status == "error"
        assert error.startswith("pinned host memory allocation failed (host RAM or the locked")
        assert "RuntimeError: CUDA error: out of memory" in error and "\n" not in error

    for text in (
        "cudaHostAlloc failed with out of memory",
        "CachingHostAllocator: pinned memory allocation of 4 GiB failed",
        "cudaHostRegister: page-locked memory exhausted",
    ):
        status, _ = classify_failure(_raised(cuda_call_failing(RuntimeError(text))))
        assert status == "error", text


def test_device_memory_failures_stay_oom() -> None:
    nccl = (
        "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL version "
        "2.21.5\nncclUnhandledCudaError: Cuda failure 'out of memory'"
    )
    for exc in (
        torch.OutOfMemoryError(ALLOCATOR_OOM),
        RuntimeError(CUDA_ERROR_OOM),  # a device-side CUDA call, not a pinned allocation
        RuntimeError(nccl),
        torch.OutOfMemoryError("rank tensor memory 9 bytes exceeds the limit of 8 bytes"),
    ):
        raised = _raised(cuda_call_failing(exc))
        assert is_oom(raised) and not pinned_host_failure(raised)
        assert classify_failure(raised)[0] == "oom"
    # the device allocator's own OOM stays the device's, whatever frame it came through
    device_oom = types.SimpleNamespace(
        pin_memory=cuda_call_failing(torch.OutOfMemoryError(ALLOCATOR_OOM))
    )
    assert classify_failure(_raised(lambda: allocate_swap_buffer(device_oom)))[0] == "oom"
    assert classify_failure(ValueError("bad config"))[0] == "error"


def test_the_cuda_limit_covers_what_lies_outside_the_allocator() -> None:
    # an 80 GiB card probing a 24 GiB limit, 600 MiB of context + NCCL + cuBLAS outside
    MiB = 2**20
    total, overhead = 80 * GiB, 600 * MiB
    assert allocator_fraction(24 * GiB, overhead, total) == pytest.approx(
        (24 * 1024 - 600) / (80 * 1024)
    )
    assert allocator_fraction(200 * GiB, overhead, total) == 1.0
    assert allocator_fraction(GiB // 2, overhead, total) == 0.0  # nothing fits: every alloc OOMs
    # mem_get_info: 80 GiB total, 70 GiB free, 10 GiB less 600 MiB reserved by the allocator
    assert device_overhead_bytes(total, 70 * GiB, 10 * GiB - overhead) == overhead
    assert device_overhead_bytes(total, 75 * GiB, 6 * GiB) == 0  # never negative
    # DeepSpeed asks what is free: the card's free memory, capped by the budget left
    budget = 24 * GiB - overhead
    assert limited_available_memory(70 * GiB, budget, 9 * GiB) == budget - 9 * GiB
    assert limited_available_memory(GiB, budget, 9 * GiB) == GiB  # the card is the limit
    assert limited_available_memory(70 * GiB, budget, 30 * GiB) == 0


def test_deepspeed_sees_the_limit_as_its_available_memory() -> None:
    """ZeRO-1/2 flattens on the device when get_accelerator().available_memory() says the
    copy fits: in a probe it reports what is left of the limit (real DeepSpeed accelerator)."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    assert accelerator.available_memory() > 0
    # the host's free memory moves while other tests run beside this one: the card is held
    # at a fixed free size, so that each reading below is exact
    card = 8 * GiB
    accelerator.available_memory = lambda device_index=None: card
    reserved = [GiB // 4]
    try:
        limit_available_memory(accelerator, GiB, lambda: reserved[0])
        assert accelerator.available_memory() == GiB - GiB // 4
        reserved[0] = 2 * GiB
        assert accelerator.available_memory() == 0
        limit_available_memory(accelerator, 10**15, lambda: 0)  # a new limit replaces it
        assert accelerator.available_memory() == card
        limit_available_memory(accelerator, 16 * GiB, lambda: 0)  # the card is the bound
        assert accelerator.available_memory() == card
    finally:
        del accelerator.available_memory  # the class's own method again
        del accelerator._autotune_available_memory


def test_leak_tolerance() -> None:
    assert leak_tolerance_bytes(80 * GiB) == int(0.8 * GiB)
    assert leak_tolerance_bytes(GiB) == 64 * 2**20


def test_fp16_skipped_steps_extend_warmup_and_are_never_timed() -> None:
    # the loss scaler overflows at first: warm-up goes on until real steps settle
    assert not steps.warmup_done([0.05, 0.05], [True, True], 2, 6)
    assert not steps.warmup_done(
        [0.05, 0.05, 0.2, 0.2, 0.05], [True, True, False, False, True], 2, 6
    )
    assert steps.warmup_done([0.05, 0.05, 0.2, 0.2], [True, True, False, False], 2, 6)
    # skipped steps neither settle warm-up nor count toward its cap
    assert not steps.warmup_done([0.2, 0.05, 0.3], [False, True, False], 2, 6)
    assert steps.warmup_done([0.2, 0.3, 0.4], [False, False, False], 2, 3)
    # a scale that never settles stops extending the warm-up
    many = steps.MAX_SKIPPED_STEPS
    assert steps.warmup_done([0.05] * many, [True] * many, 2, 6)
    kwargs = {"min_steps": 3, "max_steps": 5, "target": 0.5, "max_s": 60.0}
    assert not steps.timing_done([0.2, 0.2], 4, **kwargs)
    assert steps.timing_done([0.2, 0.2, 0.2], 4, **kwargs)
    assert steps.timing_done([0.2], steps.MAX_SKIPPED_STEPS, **kwargs)


def test_local_slots_map_through_the_parents_visible_devices(monkeypatch) -> None:
    assert slot_devices(2, 1, None) == ["0", "1"]
    assert slot_devices(2, 1, "4,5") == ["4", "5"]
    assert slot_devices(1, 2, "4,5") == ["4,5"]
    assert slot_devices(2, 2, "3, 7,1,6") == ["3,7", "1,6"]
    uuids = "GPU-8e1b3f0a-aaaa,GPU-1c2d3e4f-bbbb,MIG-5a6b7c8d-cccc"
    assert slot_devices(3, 1, uuids) == uuids.split(",")
    assert slot_devices(1, 2, uuids) == ["GPU-8e1b3f0a-aaaa,GPU-1c2d3e4f-bbbb"]
    for parent in ("4", ""):
        with pytest.raises(ExecutorError) as error:
            slot_devices(2, 1, parent)
        assert "\n" not in str(error.value)
        assert re.search(r"lists [01] device\(s\) but 2 slot\(s\) of 1 need 2", str(error.value))

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    executor = LocalExecutor(total_devices=2, devices_per_probe=1, cuda=True)
    try:
        assert [slot.visible_devices for slot in executor._slots] == ["4", "5"]
    finally:
        executor.close()
    with pytest.raises(ExecutorError, match="CUDA_VISIBLE_DEVICES='4,5' lists 2 device"):
        LocalExecutor(total_devices=4, devices_per_probe=2, cuda=True)
    executor = LocalExecutor(total_devices=2, devices_per_probe=1, cuda=False)
    try:
        assert [slot.visible_devices for slot in executor._slots] == [None, None]
    finally:
        executor.close()


def test_scratch_dir_is_an_absolute_subfolder(tmp_path: Path) -> None:
    from autotune.execution.launch import ProbeJob

    job = {"trial_dir": str(tmp_path), "world_size": 1, "timeout_s": 1.0}
    job |= {"threads_per_rank": 1, "cwd": str(tmp_path), "spec": _spec()}
    assert ProbeJob(**job, scratch_dir=str(tmp_path / "swap")).scratch_dir
    for bad in ("relative/swap", "/", "/nvme"):
        with pytest.raises(ValueError, match="scratch_dir must be an absolute folder"):
            ProbeJob(**job, scratch_dir=bad)


def _spec() -> ProbeSpec:
    from autotune.candidate import Candidate

    candidate = Candidate(
        precision="fp32", zero_stage=0, micro_batch_size=1, gradient_accumulation_steps=1,
        data_parallel_size=1,
    )  # fmt: skip
    return ProbeSpec(
        workload="gpt-tiny",
        candidate=candidate,
        backend_config=DEEPSPEED.render_config(candidate),
        accelerator="cpu",
        vram_limit_bytes=GiB,
        device_memory_bytes=GiB,
    )


def test_probes_default_to_pytorchs_float32_matmul_precision() -> None:
    assert _spec().float32_matmul_precision == "highest"
    assert torch.get_float32_matmul_precision() == "highest"  # PyTorch's own default


def test_torch_floor_has_out_of_memory_error() -> None:
    """is_oom needs torch.OutOfMemoryError (torch 2.5); the floor must say so and the
    range must hold the CPU wheel the README installs (2.13)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        pytest.skip("tomllib needs Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    spec = next(d for d in project["dependencies"] if d.startswith("torch"))
    floor = re.search(r">=\s*(\d+)\.(\d+)", spec)
    ceiling = re.search(r"<\s*(\d+)\.(\d+)", spec)
    assert floor and ceiling, spec
    assert (int(floor[1]), int(floor[2])) >= (2, 5)
    assert (int(floor[1]), int(floor[2])) <= (2, 13) < (int(ceiling[1]), int(ceiling[2]))
    assert hasattr(torch, "OutOfMemoryError")
