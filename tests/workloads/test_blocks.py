"""The units FSDP2 shards: a transformers model's blocks by its ``_no_split_modules``, a
DiT's timestep embeddings before its blocks, and their parameter counts, each tensor in
the innermost unit that holds it."""

from __future__ import annotations

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
