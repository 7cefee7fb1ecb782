"""The cost model prices an activation offload as its traced bytes over the host link,
out in forward and back in backward, every micro-step, not overlapped."""

from __future__ import annotations

import pytest

from autotune.candidate import Candidate
from autotune.memory.activations import profile
from autotune.run.cost_model import _HOST_LINK_BYTES_S, machine_cost_model
from autotune.workloads import get_workload


def _candidate(offload: str) -> Candidate:
    return Candidate(
        precision="bf16",
        zero_stage=2,
        micro_batch_size=2,
        gradient_accumulation_steps=4,
        data_parallel_size=2,
        checkpoint_fraction=0.0,
        activation_offload=offload,  # type: ignore[arg-type]
    )


def test_the_offloaded_bytes_cross_the_host_link_twice_a_micro_step() -> None:
    workload = get_workload("gpt-tiny")
    model, _ = machine_cost_model(
        workload, "cuda", threads=1, precisions=("bf16",), nodes=1, tf32=False
    )
    kept, moved = model.terms(_candidate("none")), model.terms(_candidate("cpu"))
    offloaded = profile(workload, 2, "bf16", 0.0, "dropped", "cuda", "full", "cpu").offloaded_bytes
    assert offloaded > 0
    expected_s = 4 * 2 * offloaded / _HOST_LINK_BYTES_S["cuda"]
    assert moved["host_transfer"] - kept["host_transfer"] == pytest.approx(expected_s)
    assert {k: v for k, v in moved.items() if k != "host_transfer"} == {
        k: v for k, v in kept.items() if k != "host_transfer"
    }
    assert model.step_time_s(_candidate("cpu")) > model.step_time_s(_candidate("none"))
