"""The checkpoint fraction in a space file: shares of the blocks, rounded to whole blocks
at binding, searched beside the rest; the all-or-nothing switch searched as before."""

from __future__ import annotations

import optuna
import pytest

from autotune.errors import SpaceError
from autotune.space import parse_space
from tests.support.hardware import CPU

SPACE = "precision: [fp32]\nzero_stage: [0, 3]\nmicro_batch_size: [4]\n"


def test_fractions_round_to_whole_blocks_and_those_that_meet_are_one() -> None:
    spec = parse_space(SPACE + "checkpoint_fraction: [0, 0.25, 0.27, 0.5, 1]\n")
    bound = spec.bind(CPU, data_parallel_size=2, global_batch=8, checkpoint_blocks=12)
    assert bound.checkpoint_fractions == (0.0, 0.25, 0.5, 1.0)
    assert any("0.25, 0.27 recompute the same 3 of 12 blocks" in n for n in bound.notes)
    six = spec.bind(CPU, data_parallel_size=2, global_batch=8, checkpoint_blocks=6)
    assert six.checkpoint_fractions == (0.0, 2 / 6, 0.5, 1.0)  # 0.25 of 6: 1.5 rounds up
    labels = sorted(c.label for c in six.candidates())
    assert "z0 fp32 mb4x1 ckpt:0.33" in labels and "z3 fp32 mb4x1 ckpt" in labels
    assert six.size() == 2 * 4


def test_a_small_share_of_few_blocks_recomputes_one() -> None:
    spec = parse_space(SPACE + "checkpoint_fraction: [0.1]\n")
    bound = spec.bind(CPU, data_parallel_size=2, global_batch=8, checkpoint_blocks=2)
    assert bound.checkpoint_fractions == (0.5,)


def test_optuna_asks_the_fraction_and_params_of_maps_back() -> None:
    spec = parse_space(SPACE + "checkpoint_fraction: [0, 0.5, 1]\n")
    bound = spec.bind(CPU, data_parallel_size=2, global_batch=8, checkpoint_blocks=4)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(20):
        trial = study.ask()
        candidate = bound.suggest(trial)
        assert bound.params_of(candidate) == trial.params
        seen.add(candidate.checkpoint_fraction)
    assert seen == {0.0, 0.5, 1.0}


def test_a_space_with_the_switch_asks_it_as_before() -> None:
    bound = parse_space(SPACE + "activation_checkpointing: [false, true]\n").bind(
        CPU, data_parallel_size=2, global_batch=8
    )
    assert bound.checkpoint_fractions == ()
    candidate = next(c for c in bound.candidates() if c.activation_checkpointing)
    assert bound.params_of(candidate)["activation_checkpointing"] is True
    assert candidate.checkpoint_fraction == 1.0
    assert "checkpoint_fraction" not in bound.spec.stored()


def test_the_fraction_is_stored_with_the_space() -> None:
    spec = parse_space(SPACE + "checkpoint_fraction: [0, 0.5]\n")
    assert spec.stored()["checkpoint_fraction"] == [0.0, 0.5]
    assert spec.checkpointing_fractions == [0.0, 0.5]
    assert spec.with_checkpointing([0.0]).checkpointing_fractions == [0.0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("checkpoint_fraction: [1.5]\n", r"space.yaml:4: checkpoint_fraction: .*\[0, 1\]"),
        ("checkpoint_fraction: [0.5, 0.5]\n", "lists a value twice"),
        (
            "checkpoint_fraction: [0.5]\nactivation_checkpointing: [true]\n",
            "give checkpoint_fraction or activation_checkpointing, not both",
        ),
    ],
)
def test_bad_fractions_get_one_line(text: str, message: str) -> None:
    with pytest.raises(SpaceError, match=message):
        parse_space(SPACE + text, source="space.yaml")


def test_the_policy_is_asked_only_where_some_block_is_recomputed() -> None:
    spec = parse_space(
        SPACE + "checkpoint_fraction: [0, 0.5, 1]\ncheckpoint_policy: [full, selective]\n"
    )
    bound = spec.bind(CPU, data_parallel_size=2, global_batch=8, checkpoint_blocks=4)
    labels = {c.label.split(" ", 1)[1] for c in bound.candidates() if c.zero_stage == 0}
    assert labels == {
        "fp32 mb4x1",
        "fp32 mb4x1 ckpt:0.5",
        "fp32 mb4x1 ckpt:0.5:sel",
        "fp32 mb4x1 ckpt",
        "fp32 mb4x1 ckpt:sel",
    }
    assert spec.stored()["checkpoint_policy"] == ["full", "selective"]
    assert "checkpoint_policy" not in parse_space(SPACE).stored()
    for candidate in bound.candidates():
        params = bound.params_of(candidate)
        assert ("checkpoint_policy" in params) == candidate.activation_checkpointing


def test_the_counts_per_value_spell_the_dial_as_the_space_does() -> None:
    dial = parse_space(
        SPACE + "checkpoint_fraction: [0, 0.5, 1]\ncheckpoint_policy: [full, selective]\n"
    ).bind(CPU, data_parallel_size=2, global_batch=8, checkpoint_blocks=4)
    dims = dial.dimensions()
    assert dims["checkpoint_fraction"] == {"0": 2, "0.5": 4, "1": 4}
    assert dims["checkpoint_policy"] == {"full": 4, "selective": 4}  # asked where fraction > 0
    assert "activation_checkpointing" not in dims
    switch = parse_space(SPACE + "activation_checkpointing: [false, true]\n").bind(
        CPU, data_parallel_size=2, global_batch=8
    )
    assert switch.dimensions()["activation_checkpointing"] == {"False": 2, "True": 2}
    assert "checkpoint_fraction" not in switch.dimensions()


def test_activation_offload_is_asked_only_where_some_block_is_kept() -> None:
    spec = parse_space(
        SPACE + "checkpoint_fraction: [0, 0.5, 1]\nactivation_offload: [none, cpu]\n"
    )
    bound = spec.bind(CPU, data_parallel_size=2, global_batch=8, checkpoint_blocks=4)
    labels = {c.label.split(" ", 1)[1] for c in bound.candidates() if c.zero_stage == 0}
    assert labels == {
        "fp32 mb4x1",
        "fp32 mb4x1 act:cpu",
        "fp32 mb4x1 ckpt:0.5",
        "fp32 mb4x1 ckpt:0.5 act:cpu",
        "fp32 mb4x1 ckpt",
    }
    for candidate in bound.candidates():
        params = bound.params_of(candidate)
        assert ("activation_offload" in params) == (candidate.checkpoint_fraction < 1)
    assert spec.stored()["activation_offload"] == ["none", "cpu"]
    assert "activation_offload" not in parse_space(SPACE).stored()
    # counted as the space spells it: both values, where some block is kept
    assert bound.dimensions()["activation_offload"] == {"none": 4, "cpu": 4}
    assert all(
        c.activation_offload == "none"
        for c in parse_space(SPACE).bind(CPU, data_parallel_size=2, global_batch=8).candidates()
    )


def test_optuna_asks_the_offload_and_params_of_maps_back() -> None:
    spec = parse_space(
        SPACE + "activation_checkpointing: [false, true]\nactivation_offload: [none, cpu]\n"
    )
    bound = spec.bind(CPU, data_parallel_size=2, global_batch=8)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        candidate = bound.suggest(trial)
        assert bound.params_of(candidate) == trial.params
        seen.add((candidate.activation_checkpointing, candidate.activation_offload))
    assert seen == {(False, "none"), (False, "cpu"), (True, "none")}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("activation_offload: [gpu]\n", r"space.yaml:4: activation_offload"),
        ("activation_offload: [cpu, cpu]\n", "lists a value twice"),
        ("activation_offload: []\n", "activation_offload"),
    ],
)
def test_bad_offload_values_get_one_line(text: str, message: str) -> None:
    with pytest.raises(SpaceError, match=message) as raised:
        parse_space(SPACE + text, source="space.yaml")
    assert "\n" not in str(raised.value)
