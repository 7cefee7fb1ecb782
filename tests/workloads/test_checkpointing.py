"""Activation checkpointing of a model's blocks: the share counted in whole blocks, the
first ones recomputed (each workload's way), in full or selectively, training as without."""

from __future__ import annotations

import pytest
import torch

from autotune.workloads import get_workload


def test_a_fraction_counts_whole_blocks_halves_up_and_at_least_one() -> None:
    from autotune.workloads.checkpointing import checkpointed_block_count

    assert [checkpointed_block_count(f, 12) for f in (0, 0.25, 0.3, 0.5, 1)] == [0, 3, 4, 6, 12]
    assert checkpointed_block_count(0.25, 6) == 2  # 1.5 rounds up
    assert checkpointed_block_count(0.01, 12) == 1
    assert checkpointed_block_count(0.5, 0) == 0


@pytest.mark.parametrize("name", ["gpt-tiny", "dit-tiny"])
@pytest.mark.parametrize("policy", ["full", "selective"])
def test_the_first_blocks_are_recomputed_and_train_as_without(name: str, policy: str) -> None:
    """The first k of the blocks recompute (transformers' switch per layer; each DiT
    block's forward under torch.utils.checkpoint), and the gradients are those of the
    model without checkpointing."""
    import functools

    from autotune.workloads.checkpointing import apply_checkpointing, partial_checkpointing_blocks

    workload = get_workload(name).with_layers(4)
    assert partial_checkpointing_blocks(workload) == 4

    def trained(fraction: float) -> tuple[torch.nn.Module, list[torch.Tensor]]:
        torch.manual_seed(0)
        model = workload.build_model()
        apply_checkpointing(workload, model, fraction, policy)
        model.train()
        torch.manual_seed(1)
        workload.loss(model, workload.make_batch(2, torch.device("cpu"))).backward()
        return model, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    _, plain = trained(0.0)
    model, half = trained(0.5)
    for a, b in zip(plain, half, strict=True):
        torch.testing.assert_close(a, b)
    blocks = workload.checkpoint_blocks(model)
    if name == "gpt-tiny":
        recomputing = [block.gradient_checkpointing for block in blocks]
    else:
        recomputing = [isinstance(block.forward, functools.partial) for block in blocks]
    assert recomputing == [True, True, False, False]


def test_a_workload_whose_switch_takes_no_blocks_has_no_share() -> None:
    from autotune.workloads.base import Workload
    from autotune.workloads.checkpointing import partial_checkpointing_blocks

    class AllOrNothing(Workload):
        name = "all-or-nothing"
        default_global_batch = 4

        def build_model(self) -> torch.nn.Module:
            return torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2)]))

        def make_batch(self, micro_batch_size: int, device: torch.device) -> torch.Tensor:
            return torch.zeros(micro_batch_size, 2, device=device)

        def enable_activation_checkpointing(self, model: torch.nn.Module) -> None:  # type: ignore[override]
            return None

    assert partial_checkpointing_blocks(AllOrNothing()) is None


@pytest.mark.parametrize("name", ["gpt-tiny", "dit-tiny"])
def test_the_selective_policy_holds_between_none_and_full(name: str) -> None:
    """It keeps the matmul and attention outputs of the recomputed blocks: more than
    recomputing every op, less than recomputing none (the forward's live bytes, counted by
    the probe's tensor tracker)."""
    from autotune.probe import TensorMemoryTracker
    from autotune.workloads.checkpointing import apply_checkpointing

    workload = get_workload(name).with_layers(4)

    def forward_peak(fraction: float, policy: str) -> int:
        torch.manual_seed(0)
        model = workload.build_model()
        apply_checkpointing(workload, model, fraction, policy)
        model.train()
        batch = workload.make_batch(4, torch.device("cpu"))
        with TensorMemoryTracker() as tracker:
            loss = workload.loss(model, batch)
            peak = tracker.peak_bytes
            loss.backward()
        return peak

    none, full, selective = (
        forward_peak(0, "full"),
        forward_peak(1, "full"),
        forward_peak(1, "selective"),
    )
    assert full < selective < none, (full, selective, none)
