"""A share of the blocks recomputed: each kind of block traced as it runs, the profile
read off the plane of three mixed stacks, between none and all."""

from __future__ import annotations

import pytest

from autotune.candidate import Candidate
from autotune.memory import MemoryModel
from autotune.memory.activations import profile, trace_once
from autotune.workloads import get_workload

FIELDS = ("forward_peak_bytes", "backward_peak_bytes", "at_first_grad_bytes")


@pytest.mark.parametrize("name", ["gpt-tiny", "dit-tiny"])
@pytest.mark.parametrize("kind", ["dropped", "accumulate"])
def test_stacks_of_the_fractions_proportion_extrapolate_to_the_whole_trace(
    name: str, kind: str
) -> None:
    """12 blocks, the first k recomputed: the line through the stacks of k/g of n/g blocks
    and twice that, read at n, is the whole model's trace (where one event leads the peak
    from the shorter stack on: here at micro-batch 2)."""
    workload = get_workload(name).with_layers(12)
    for recomputed in (3, 6, 9):
        whole = trace_once(workload, 2, "fp32", (recomputed, 12), kind)  # type: ignore[arg-type]
        line = profile(workload, 2, "fp32", recomputed / 12, kind)  # type: ignore[arg-type]
        for field in FIELDS:
            assert getattr(line, field) == pytest.approx(getattr(whole, field), rel=1e-6)


def test_a_fraction_with_no_shorter_stack_is_traced_whole() -> None:
    workload = get_workload("gpt-tiny").with_layers(5)
    whole = trace_once(workload, 2, "fp32", (2, 5), "dropped")
    assert profile(workload, 2, "fp32", 0.4, "dropped") == whole


def test_more_blocks_recomputed_hold_less_and_the_ends_are_none_and_all() -> None:
    workload = get_workload("gpt-tiny").with_layers(4)
    peaks = [profile(workload, 4, "fp32", f).forward_peak_bytes for f in (0, 0.25, 0.5, 0.75, 1)]
    assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 5
    # a fraction that rounds to none or all of the blocks is that profile
    assert profile(workload, 4, "fp32", 0.1) == profile(workload, 4, "fp32", 0.25)
    assert profile(workload, 4, "fp32", 0.95) == profile(workload, 4, "fp32", 1.0)


def test_the_memory_model_predicts_a_share_between_its_neighbours() -> None:
    model = MemoryModel(get_workload("gpt2"))

    def peak(fraction: float, stage: int) -> int:
        candidate = Candidate(
            precision="fp32",
            zero_stage=stage,
            micro_batch_size=2,
            gradient_accumulation_steps=1,
            data_parallel_size=2,
            checkpoint_fraction=fraction,
        )
        return model.predict(candidate).device_bytes

    for stage in (0, 3):
        peaks = [peak(f, stage) for f in (0, 0.25, 0.5, 0.75, 1)]
        assert peaks == sorted(peaks, reverse=True) and len(set(peaks)) == 5, peaks


def test_the_selective_policy_is_traced_between_none_and_full() -> None:
    workload = get_workload("gpt-tiny").with_layers(4)
    for fraction in (0.5, 1.0):
        full = profile(workload, 4, "fp32", fraction, "dropped", "cpu", "full")
        selective = profile(workload, 4, "fp32", fraction, "dropped", "cpu", "selective")
        none = profile(workload, 4, "fp32", 0.0, "dropped")
        assert full.forward_peak_bytes < selective.forward_peak_bytes < none.forward_peak_bytes
