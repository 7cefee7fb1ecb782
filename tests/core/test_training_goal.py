"""The training goal's arithmetic and its flags' checks (``autotune plan --study``)."""

from __future__ import annotations

import pytest

from autotune.errors import SettingsError
from autotune.training_goal import TrainingGoal
from autotune.units import parse_count, parse_world_sizes


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


def test_objectives_part_only_across_world_sizes() -> None:
    """At one world size every objective ranks as throughput does; across them, cost ranks
    by samples/s per GPU and a deadline puts those that finish first, by cost."""
    cost = TrainingGoal.of("cost", gpu_hour_price_usd=2.0)
    assert cost.score(100.0, 1) > cost.score(180.0, 2)  # 100 vs 90 per GPU
    assert cost.score(120.0, 2) > cost.score(100.0, 2)  # one world size: the faster
    deadline = TrainingGoal.of("deadline", train_samples=3600.0, deadline_s=36.0)  # 100/s
    assert deadline.tier(99.0) == 0 and deadline.tier(100.0) == 1
    # both finish: the cheaper (fewer GPU-seconds per sample) wins over the faster
    assert deadline.score(100.0, 1) > deadline.score(190.0, 2)
    # one finishes: it wins, however much more it costs
    assert deadline.score(150.0, 4) > deadline.score(99.0, 1)
    # none finishes: the fastest
    assert deadline.score(90.0, 2) > deadline.score(80.0, 1)
    throughput = TrainingGoal()
    assert throughput.score(180.0, 2) > throughput.score(100.0, 1)


def test_the_rate_to_match_is_what_scores_as_high_at_another_world_size() -> None:
    cost = TrainingGoal.of("cost", gpu_hour_price_usd=1.0)
    assert cost.rate_to_match(cost.score(100.0, 1), gpus=4) == pytest.approx(400.0)
    assert TrainingGoal().rate_to_match((0, 100.0), gpus=4) == 100.0
    deadline = TrainingGoal.of("deadline", train_samples=3600.0, deadline_s=36.0)  # 100/s
    # the best finishes at 1 GPU (120/s): 2 GPUs must finish and match 120 per GPU
    assert deadline.rate_to_match(deadline.score(120.0, 1), gpus=2) == pytest.approx(240.0)
    assert deadline.rate_to_match(deadline.score(240.0, 2), gpus=1) == pytest.approx(120.0)
    # the best does not finish (80/s): finishing, or beating 80, is enough
    assert deadline.rate_to_match(deadline.score(80.0, 1), gpus=4) == pytest.approx(80.0)
    assert deadline.rate_to_match(deadline.score(0.0, 1), gpus=4) == 0.0
    for goal, rate, gpus in ((cost, 100.0, 1), (deadline, 120.0, 1), (deadline, 80.0, 1)):
        for other in (1, 2, 4):
            matched = goal.rate_to_match(goal.score(rate, gpus), other)
            assert goal.score(matched, other) >= goal.score(rate, gpus)
            assert goal.score(matched * 0.99, other) < goal.score(rate, gpus)


def test_a_price_changes_no_order_a_new_deadline_does() -> None:
    cheap = TrainingGoal.of("cost", gpu_hour_price_usd=1.0)
    assert cheap.ranks_like(TrainingGoal.of("cost", gpu_hour_price_usd=9.0))
    assert not cheap.ranks_like(TrainingGoal())
    day = TrainingGoal.of("deadline", train_samples=1e6, deadline_s=86400.0)
    assert day.ranks_like(day.model_copy(update={"gpu_hour_price_usd": 3.0}))
    assert not day.ranks_like(day.model_copy(update={"deadline_s": 3600.0}))


def test_tokens_per_sample_turns_a_token_count_into_time() -> None:
    goal = TrainingGoal.of(
        "deadline", train_tokens=1e9, deadline_s=3600.0, gpu_hour_price_usd=2.0
    ).model_copy(update={"tokens_per_sample": 1000})
    assert goal.required_samples_per_s() == pytest.approx(1e6 / 3600.0)
    assert goal.time_to_train_s(1000.0) == pytest.approx(1000.0)
    assert goal.figures(1000.0, 4) == {
        "time_to_train_s": pytest.approx(1000.0),
        "cost_usd": pytest.approx(2.0 * 4 * 1000.0 / 3600.0),
        "cost_per_million_samples_usd": pytest.approx(2.0 * 4 * 1000.0 / 3600.0),
        "finishes_by_deadline": True,
    }
    assert goal.outcome(1000.0, 4) == "trains in 16m40s for $2.22, within the deadline"
    assert goal.brief(100.0, 4) == "2h46m40s $22 late"
    assert goal.noun(1000.0) == "cheapest within the deadline"
    assert goal.noun(100.0) == "fastest (none finishes within the deadline)"
    assert TrainingGoal.of("cost", gpu_hour_price_usd=3.6).outcome(1000.0, 2) == (
        "costs $2.00 per million samples"
    )
    assert TrainingGoal().outcome(1000.0, 2) == "" and not TrainingGoal().sized_or_priced
