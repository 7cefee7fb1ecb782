"""The training goal's arithmetic and its flags' checks (``autotune plan --study``)."""

from __future__ import annotations

import pytest

from autotune.errors import SettingsError
from autotune.training_goal import TrainingGoal, parse_count, parse_world_sizes


def test_time_and_cost_to_train_are_size_over_throughput_and_price_by_gpu_hours() -> None:
    goal = TrainingGoal.of("cost", gpu_hour_price_usd=2.0, train_tokens=3.6e9)
    seconds = goal.time_to_train_s(samples_per_s=1000.0, tokens_per_sample=1000)
    assert seconds == pytest.approx(3600.0)  # 3.6e9 tokens at 1e6 tokens/s
    assert goal.cost_usd(8, seconds) == pytest.approx(16.0)  # 8 GPUs for an hour at $2
    assert goal.finishes(seconds) is None  # no deadline
    by_samples = TrainingGoal.of("throughput", train_samples=5e6)
    assert by_samples.time_to_train_s(500.0, tokens_per_sample=1000) == pytest.approx(1e4)
    assert by_samples.cost_usd(8, 1e4) is None  # no price
    priced = TrainingGoal.of("throughput", gpu_hour_price_usd=3.6)
    assert priced.time_to_train_s(500.0, 1) is None  # no size
    assert priced.cost_per_million_samples_usd(2, 1000.0) == pytest.approx(2.0)  # 1000 s x 2
    deadline = TrainingGoal.of("deadline", train_samples=1e6, deadline_s=900.0)
    assert deadline.finishes(899.0) is True and deadline.finishes(901.0) is False


@pytest.mark.parametrize(
    ("objective", "flags", "message"),
    [
        ("speed", {}, "--objective speed: choose one of throughput, cost, deadline"),
        ("cost", {}, "--objective cost needs --gpu-hour-price USD"),
        ("deadline", {"train_samples": 1e6}, "--objective deadline needs --deadline D (e.g. 3d)"),
        ("deadline", {"deadline_s": 60.0}, "needs --train-tokens N or --train-samples N"),
        ("deadline", {}, "needs --deadline D (e.g. 3d) and --train-tokens N or --train-samples N"),
        ("throughput", {"deadline_s": 60.0}, "--deadline with --objective throughput"),
        ("throughput", {"train_samples": 1.0, "train_tokens": 1.0}, "give one size"),
        ("throughput", {"gpu_hour_price_usd": 0.0}, "--gpu-hour-price 0: give a positive"),
    ],
)
def test_bad_combinations_are_one_line(objective: str, flags: dict, message: str) -> None:
    with pytest.raises(SettingsError, match=None) as raised:
        TrainingGoal.of(objective, **flags)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_counts_and_world_sizes_read_as_users_write_them() -> None:
    assert parse_count("10B", flag="--train-tokens") == 1e10
    assert parse_count("2.5k", flag="--train-samples") == 2500
    assert parse_count("1e9", flag="--train-tokens") == 1e9
    assert parse_count("500_000", flag="--train-samples") == 5e5
    with pytest.raises(SettingsError, match="--train-tokens: cannot read 'ten'"):
        parse_count("ten", flag="--train-tokens")
    with pytest.raises(SettingsError, match="give a positive count"):
        parse_count("0", flag="--train-tokens")
    assert parse_world_sizes("8") == (8,)
    assert parse_world_sizes("1-4") == (1, 2, 3, 4)
    assert parse_world_sizes("8,2,4,4") == (2, 4, 8)
    assert parse_world_sizes("1-2,8") == (1, 2, 8)
    for bad in ("0", "4-2", "x", "2-", ""):
        with pytest.raises(SettingsError, match="--gpus"):
            parse_world_sizes(bad)
