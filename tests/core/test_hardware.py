"""The hardware line a run starts with: on CPU it names what trains on the ranks."""

from __future__ import annotations

from autotune.backends import cpu_rank_libraries
from tests.support.hardware import CPU


def test_cpu_ranks_are_named_by_the_spaces_backends() -> None:
    deepspeed = CPU.describe(2)
    assert "with DeepSpeed's CPU accelerator (gloo, 1 thread(s) each)" in deepspeed
    fsdp2 = CPU.describe(2, cpu_rank_libraries(["fsdp2"]))
    assert "with torch's FSDP2 (gloo" in fsdp2 and "DeepSpeed" not in fsdp2
    both = CPU.describe(2, cpu_rank_libraries(["fsdp2", "deepspeed"]))  # the registry's order
    assert "with DeepSpeed's CPU accelerator or torch's FSDP2 (gloo" in both
