"""The communication backend a rank's process group starts with: on CUDA NCCL with gloo for
host tensors (FSDP2's offloaded shards), on CPU ranks gloo, asked for by both training
backends alike.

Starting an NCCL group needs a GPU: where a test would start one, the call that would is
replaced by a recorder (``recorded``), named so; torch's own parser reads the string."""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed.distributed_c10d import Backend, BackendConfig

from autotune.backends import get_backend
from autotune.backends._process_group import process_group_backend


def test_cuda_ranks_get_gloo_for_host_tensors_beside_nccl() -> None:
    assert process_group_backend("cpu") == "gloo"
    pair = process_group_backend("cuda")
    # torch's parser of init_process_group's backend: one backend per device type
    assert BackendConfig(Backend(pair)).get_device_backend_map() == {"cuda": "nccl", "cpu": "gloo"}


def _recorder(calls: list[tuple[Any, ...]]) -> Any:
    def recorded(*args: Any, **kwargs: Any) -> None:
        calls.append((args, kwargs))

    return recorded


def test_fsdp2_starts_its_group_with_the_pair_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", _recorder(calls))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    get_backend("fsdp2").start_process_group()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    get_backend("fsdp2").start_process_group()
    assert calls == [(("gloo",), {}), (("cuda:nccl,cpu:gloo",), {})]


def test_deepspeed_hands_init_distributed_the_pair_on_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DeepSpeed 0.19 hands ``dist_backend`` to ``torch.distributed.init_process_group``
    unchanged (``deepspeed/comm/torch.py``, ``TorchBackend.init_process_group``)."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(deepspeed, "init_distributed", _recorder(calls))
    monkeypatch.setattr(get_accelerator(), "device_name", lambda index=None: "cpu")
    get_backend("deepspeed").start_process_group()
    monkeypatch.setattr(get_accelerator(), "device_name", lambda index=None: "cuda")
    get_backend("deepspeed").start_process_group()
    assert [kwargs["dist_backend"] for _, kwargs in calls] == ["gloo", "cuda:nccl,cpu:gloo"]
