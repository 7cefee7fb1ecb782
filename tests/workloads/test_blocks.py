"""The units FSDP2 shards: a transformers model's blocks by its ``_no_split_modules``, a
DiT's timestep embeddings before its blocks, and their parameter counts, each tensor in
the innermost unit that holds it."""

from __future__ import annotations

import pytest
import torch

from autotune.workloads import get_workload
from autotune.workloads.blocks import block_params, block_units, shard_units


def _meta(name: str) -> tuple[object, torch.nn.Module]:
    workload = get_workload(name)
    with torch.device("meta"):
        return workload, workload.build_model()


def test_a_transformers_model_is_sharded_per_block() -> None:
    workload, model = _meta("gpt-tiny")
    units = shard_units(workload, model)
    assert [type(u).__name__ for u in units] == ["GPT2Block", "GPT2Block"]
    total, largest = block_params(units)
    assert total == 2 * largest == sum(p.numel() for p in units[0].parameters()) * 2


def test_a_dits_embeddings_are_units_of_their_own_before_its_blocks() -> None:
    workload, model = _meta("dit-tiny")
    units = shard_units(workload, model)
    blocks = list(model.transformer_blocks)
    embeddings = [b.norm1.emb for b in blocks]
    assert units == [*embeddings, *blocks]
    total, _ = block_params(units)
    assert total == sum(p.numel() for b in blocks for p in b.parameters())  # each once


def test_a_model_without_blocks_has_no_units() -> None:
    assert block_units(torch.nn.Linear(2, 2)) == []
    lists = torch.nn.Module()
    lists.small = torch.nn.ModuleList([torch.nn.Linear(1, 1)])
    lists.large = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])
    assert block_units(lists) == list(lists.large)


def test_a_fraction_counts_whole_blocks_halves_up_and_at_least_one() -> None:
    from autotune.workloads.blocks import checkpointed_block_count

    assert [checkpointed_block_count(f, 12) for f in (0, 0.25, 0.3, 0.5, 1)] == [0, 3, 4, 6, 12]
    assert checkpointed_block_count(0.25, 6) == 2  # 1.5 rounds up
    assert checkpointed_block_count(0.01, 12) == 1
    assert checkpointed_block_count(0.5, 0) == 0


@pytest.mark.parametrize("name", ["gpt-tiny", "dit-tiny"])
def test_the_first_blocks_are_recomputed_and_train_as_without(name: str) -> None:
    """The first k of the blocks recompute (transformers' switch per layer; each DiT
    block's forward under torch.utils.checkpoint), and the gradients are those of the
    model without checkpointing."""
    import functools

    from autotune.workloads.blocks import apply_checkpointing, partial_checkpointing_blocks

    workload = get_workload(name).with_layers(4)
    assert partial_checkpointing_blocks(workload) == 4

    def trained(fraction: float) -> tuple[torch.nn.Module, list[torch.Tensor]]:
        torch.manual_seed(0)
        model = workload.build_model()
        apply_checkpointing(workload, model, fraction)
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
    from autotune.workloads.blocks import partial_checkpointing_blocks

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
