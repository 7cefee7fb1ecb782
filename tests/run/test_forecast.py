"""The forecast's pure parts: a configuration split over another world size at one global
batch, the rows ranked by each objective, the choice in one line."""

from __future__ import annotations

from autotune.candidate import Candidate
from autotune.run.forecast import ForecastRow, choice_line, rank, resplit
from autotune.training_goal import TrainingGoal

PROBED = Candidate(
    precision="bf16", zero_stage=2, micro_batch_size=8, gradient_accumulation_steps=2,
    data_parallel_size=2,
)  # fmt: skip


def test_resplit_keeps_the_global_batch_and_the_micro_batch_where_it_divides() -> None:
    assert PROBED.train_batch_size == 32
    at4 = resplit(PROBED, 4, 32)
    assert at4 is not None and (at4.micro_batch_size, at4.gradient_accumulation_steps) == (8, 1)
    at8 = resplit(PROBED, 8, 32)  # 4 samples per rank: the micro-batch shrinks to fit
    assert at8 is not None and (at8.micro_batch_size, at8.gradient_accumulation_steps) == (4, 1)
    at1 = resplit(PROBED, 1, 32)
    assert at1 is not None and (at1.micro_batch_size, at1.gradient_accumulation_steps) == (8, 4)
    at3 = resplit(PROBED, 3, 36)  # 12 per rank: the largest micro-batch <= 8 dividing it, 6
    assert at3 is not None and (at3.micro_batch_size, at3.gradient_accumulation_steps) == (6, 2)
    assert resplit(PROBED, 3, 32) is None  # 32 samples do not split over 3 ranks
    assert at4.zero_stage == 2 and at4.precision == "bf16" and at4.data_parallel_size == 4


def row(gpus: int, samples_per_s: float, fits: bool = True, **extra: object) -> ForecastRow:
    candidate = resplit(PROBED, gpus, 32)
    assert candidate is not None
    return ForecastRow(
        trial=0, probed=PROBED, candidate=candidate, gpus=gpus, nodes=1,
        predicted_samples_per_s=samples_per_s, fits=fits, **extra,
    )  # fmt: skip


def test_each_objective_ranks_fitting_rows_first() -> None:
    # 1 GPU at 100/s (100 per GPU), 2 at 180/s (90), 4 at 300/s (75), 8 at 500/s not fitting
    rows = [row(1, 100.0), row(2, 180.0), row(4, 300.0), row(8, 500.0, fits=False)]
    fastest = rank(rows, TrainingGoal())
    assert [r.gpus for r in fastest] == [4, 2, 1, 8]
    cheapest = rank(rows, TrainingGoal.of("cost", gpu_hour_price_usd=2.0))
    assert [r.gpus for r in cheapest] == [1, 2, 4, 8]
    assert choice_line(fastest, TrainingGoal()).startswith(
        "fastest: z2 bf16 mb8x1 on 4 GPU(s), 300.0 samples/s (predicted)"
    )


def test_a_deadline_takes_the_cheapest_that_finishes_else_says_none_does() -> None:
    goal = TrainingGoal.of(
        "deadline", train_samples=3.6e5, deadline_s=3000.0, gpu_hour_price_usd=1.0
    )
    # times to train: 3600 s, 2000 s, 1200 s: the 2 and 4 GPU rows finish, 2 is cheaper
    rows = [
        row(g, s, time_to_train_s=3.6e5 / s, finishes=3.6e5 / s <= 3000)
        for g, s in ((1, 100.0), (2, 180.0), (4, 300.0))
    ]
    ranked = rank(rows, goal)
    assert [r.gpus for r in ranked] == [2, 4, 1]
    assert choice_line(ranked, goal).startswith(
        "cheapest that finishes within 50m: z2 bf16 mb8x2 on 2 GPU(s), 180.0 samples/s"
    )
    strict = TrainingGoal.of("deadline", train_samples=3.6e5, deadline_s=60.0)
    late = [r.model_copy(update={"finishes": False}) for r in rows]
    assert choice_line(rank(late, strict), strict).startswith(
        "none finishes within 1m: the fastest, z2 bf16 mb8x1 on 4 GPU(s), 300.0 samples/s"
    )


def test_a_measured_row_stands_on_its_measurement_with_the_error_beside() -> None:
    measured = row(2, 200.0, measured_samples_per_s=160.0)
    assert measured.samples_per_s == 160.0 and abs(measured.error - 0.25) < 1e-12
    assert row(4, 300.0).error is None
