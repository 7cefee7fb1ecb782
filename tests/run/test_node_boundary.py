"""The node boundary in the models: what a node's ranks share (host RAM, cores) and what a
probe spanning nodes pays (collectives over the network)."""

from __future__ import annotations

from autotune.candidate import Candidate
from autotune.hardware import Hardware
from autotune.run.cost_model import CostModel, WorkloadFacts


def _hardware(**update: object) -> Hardware:
    values: dict[str, object] = {
        "accelerator": "cuda",
        "device_count": 16,
        "device_name": "H100",
        "device_memory_bytes": 80 * 2**30,
        "host_memory_bytes": 2 * 2**40,
        "cpu_count": 64,
        "precisions": ("fp32", "bf16", "fp16"),
    }
    return Hardware.model_validate({**values, **update})


def test_a_nodes_ranks_share_its_ram_and_cores() -> None:
    one_machine = _hardware()
    cluster = _hardware(devices_per_node=8)  # two nodes of 8
    assert one_machine.ranks_on_node(16) == 16 and one_machine.nodes_spanned(16) == 1
    assert cluster.ranks_on_node(16) == 8 and cluster.nodes_spanned(16) == 2
    assert cluster.ranks_on_node(4) == 4 and cluster.nodes_spanned(4) == 1
    assert cluster.threads_per_rank(16) == 8  # 64 cores over the 8 ranks of a node
    cpu = _hardware(accelerator="cpu", devices_per_node=8)
    assert cpu.default_vram_limit_bytes(16) == 2 * 2**40 // 8


def test_spanning_nodes_slows_collectives_and_tf32_speeds_fp32() -> None:
    facts = WorkloadFacts(params=7_000_000_000, tokens_per_sample=4096)
    z3 = Candidate(
        precision="bf16",
        zero_stage=3,
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        data_parallel_size=16,
    )
    one = CostModel(facts, "cuda").terms(z3)["communication"]
    spanning = CostModel(facts, "cuda", nodes=2).terms(z3)["communication"]
    assert spanning > 1.9 * one  # the network, not NVLink, is the ring's slowest link
    fp32 = z3.model_copy(update={"precision": "fp32"})
    ieee = CostModel(facts, "cuda").terms(fp32)["compute_fp32"]
    tf32 = CostModel(facts, "cuda", tf32=True).terms(fp32)["compute_fp32"]
    assert tf32 < ieee / 3


def test_on_a_cluster_a_searched_world_size_is_within_a_node_or_whole_nodes() -> None:
    import pytest

    from autotune.errors import SettingsError
    from autotune.run._resolved_run import _whole_node_world_sizes
    from autotune.settings import RunSettings

    searched = RunSettings.build(workload="gpt-tiny", world_sizes=(1, 2, 3, 4, 6))
    notes: list[str] = []
    kept = _whole_node_world_sizes(searched, _hardware(devices_per_node=2), notes)
    assert (kept.limits.world_sizes, kept.limits.gpus) == ((1, 2, 4, 6), 6)
    assert notes == [
        "3 rank(s) dropped from the world sizes: beyond one node (2 device(s)) a world size "
        "takes whole nodes"
    ]
    one_machine = _whole_node_world_sizes(searched, _hardware(), [])
    assert one_machine.limits.world_sizes == (1, 2, 3, 4, 6)  # no nodes to fill
    lonely = RunSettings.build(workload="gpt-tiny", world_sizes=(3, 5))
    apart = RunSettings.build(workload="gpt-tiny", world_sizes=(5, 6))
    kept_one = _whole_node_world_sizes(lonely, _hardware(devices_per_node=4), [])
    assert (kept_one.limits.world_sizes, kept_one.limits.searched_world_sizes) == ((3,), ())
    with pytest.raises(SettingsError, match="no world size fits the cluster's nodes of 4"):
        _whole_node_world_sizes(apart, _hardware(devices_per_node=4), [])
