"""Activation offload in the memory model: the kept blocks' saved activations traced as
they leave the device (hooks packing to the meta device), counted on the host instead, and
`autotune plan` showing both for GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autotune.candidate import Candidate
from autotune.memory import MemoryModel
from autotune.memory.activations import profile, trace_once
from autotune.workloads import get_workload
from tests.support.cli import run_cli

FIELDS = ("forward_peak_bytes", "backward_peak_bytes", "at_first_grad_bytes")


@pytest.mark.parametrize(
    ("name", "target", "shared"), [("gpt-tiny", "cpu", False), ("dit-tiny", "cuda", True)]
)
def test_offloaded_bytes_leave_the_device_and_are_counted_on_the_host(
    name: str, target: str, shared: bool
) -> None:
    """With none or half of the blocks recomputed, the device holds less with the kept
    blocks' activations offloaded, and at the forward's peak what it holds less is on the
    host; it still holds a block's tensors in flight, of the order of recomputing all. A
    DiT's blocks each save the conditioning they share (``shared``), which the device keeps
    for the next block and the host holds once per block: more on the host than left the
    device."""
    workload = get_workload(name).with_layers(4)
    every = profile(workload, 4, "fp32", 1.0, "dropped", target)  # type: ignore[arg-type]
    for fraction in (0.0, 0.5):
        kept = profile(workload, 4, "fp32", fraction, "dropped", target)  # type: ignore[arg-type]
        moved = profile(workload, 4, "fp32", fraction, "dropped", target, "full", "cpu")  # type: ignore[arg-type]
        assert kept.offloaded_bytes == 0 and moved.offloaded_bytes > 0
        for field in FIELDS:
            assert getattr(moved, field) < getattr(kept, field), field
        together = moved.forward_peak_bytes + moved.offloaded_bytes
        if shared:
            assert together > kept.forward_peak_bytes
        else:
            assert together == pytest.approx(kept.forward_peak_bytes, rel=1e-6)
        assert moved.backward_peak_bytes > 0.5 * every.backward_peak_bytes


def test_the_traced_host_bytes_are_what_the_hooks_pack_on_a_real_model() -> None:
    """The trace's host bytes equal the bytes the real hooks move to the host in a CPU
    forward of the same model, batch and blocks."""
    from autotune.workloads.activation_offload import OffloadLedger, offload_blocks
    from autotune.workloads.checkpointing import recompute

    workload = get_workload("gpt-tiny").with_layers(4)
    traced = trace_once(workload, 2, "fp32", (2, 4), "dropped", "cpu", "full", "cpu")
    model = workload.build_model()
    recompute(workload, model, 2)
    ledger = OffloadLedger()
    offload_blocks(workload.checkpoint_blocks(model)[2:], "cpu", ledger)
    model.train()
    workload.loss(model, workload.make_batch(2, torch.device("cpu"))).backward()
    assert ledger.packed > 0
    assert traced.offload_transfer_bytes == ledger.packed_bytes
    # gpt-tiny's saved tensors are powers of two: pinned copies hold what they carry
    assert traced.offloaded_bytes == ledger.peak_host_bytes == ledger.packed_bytes


def test_the_trace_holds_the_host_as_pinned_memory_rounds_it() -> None:
    """A trace stands for a GPU, whose pinned host copies torch's host allocator rounds up
    to a power of two: 8 x 48 fp32 activations (1536 bytes) hold 2048 on the host."""
    from autotune.workloads.activation_offload import OffloadLedger, offload_saved_tensors

    layer = torch.nn.Sequential(torch.nn.Linear(48, 48), torch.nn.Tanh())
    ledger = OffloadLedger()
    with offload_saved_tensors("meta", ledger):
        out = layer(torch.randn(8, 48))
    assert ledger.packed == 2  # the linear's input and the tanh's output
    assert ledger.packed_bytes == 2 * 1536 and ledger.peak_host_bytes == 2 * 2048
    del out


def test_a_share_with_offload_extrapolates_to_the_whole_trace() -> None:
    workload = get_workload("gpt-tiny").with_layers(12)
    whole = trace_once(workload, 2, "fp32", (6, 12), "dropped", "cpu", "full", "cpu")
    line = profile(workload, 2, "fp32", 0.5, "dropped", "cpu", "full", "cpu")
    for field in (*FIELDS, "offloaded_bytes", "offload_transfer_bytes"):
        assert getattr(line, field) == pytest.approx(getattr(whole, field), rel=1e-6)


def test_the_memory_model_moves_the_offloaded_bytes_to_the_host() -> None:
    workload = get_workload("gpt-tiny")
    model = MemoryModel(workload, accelerator="cuda")

    def estimate(offload: str, stage: int):
        return model.predict(
            Candidate(
                precision="bf16",
                zero_stage=stage,
                micro_batch_size=4,
                gradient_accumulation_steps=1,
                data_parallel_size=2,
                checkpoint_fraction=0.5,
                activation_offload=offload,  # type: ignore[arg-type]
            )
        )

    for stage in (0, 3):
        kept, moved = estimate("none", stage), estimate("cpu", stage)
        offloaded = profile(workload, 4, "bf16", 0.5, "dropped", "cuda", "full", "cpu")
        assert offloaded.offloaded_bytes > 0
        assert moved.device_bytes < kept.device_bytes
        assert moved.host.activations == pytest.approx(offloaded.offloaded_bytes)
        assert moved.host_bytes - kept.host_bytes == pytest.approx(offloaded.offloaded_bytes, abs=1)


@pytest.mark.slow
def test_plan_shows_the_offload_for_gpus(tmp_path: Path) -> None:
    """`autotune plan` predicts for GPUs, so the dimension stays: a candidate offloading its
    activations holds less on each GPU and more on the host."""
    (tmp_path / "space.yaml").write_text(
        "precision: [bf16]\nzero_stage: [3]\nmicro_batch_size: [8]\n"
        "checkpoint_fraction: [0, 0.5]\nactivation_offload: [none, cpu]\n"
    )
    result = run_cli(
        *("plan", "--workload", "gpt2", "--gpus", "2", "--vram", "16GiB"),
        *("--space", "space.yaml", "--all"),
        cwd=tmp_path,
        env={"COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr
    rows = {
        cells[2]: (float(cells[3]), float(cells[4]))
        for line in result.stdout.splitlines()
        if line.startswith("│") and (cells := [c.strip() for c in line.split("│")])
    }
    assert set(rows) == {
        "z3 bf16 mb8x32",
        "z3 bf16 mb8x32 act:cpu",
        "z3 bf16 mb8x32 ckpt:0.5",
        "z3 bf16 mb8x32 ckpt:0.5 act:cpu",
    }
    for kept in ("z3 bf16 mb8x32", "z3 bf16 mb8x32 ckpt:0.5"):
        (device, host), (moved_device, moved_host) = rows[kept], rows[f"{kept} act:cpu"]
        assert moved_device < device and moved_host > host
