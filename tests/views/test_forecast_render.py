"""``autotune plan --study``'s table on a forecast made by hand: the columns the goal
brings (time to train, USD, in time), measured and predicted rows told apart, the choice
under the table, readable in 80 columns."""

from __future__ import annotations

from rich.console import Console

from autotune.candidate import Candidate
from autotune.run.forecast import Forecast, ForecastRow, choice_line, rank, resplit
from autotune.training_goal import TrainingGoal
from autotune.views import forecast_report

PROBED = Candidate(
    precision="fp32", zero_stage=1, micro_batch_size=4, gradient_accumulation_steps=2,
    data_parallel_size=2,
)  # fmt: skip


def render(forecast: Forecast, width: int = 80) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(forecast_report(forecast, limit_rows=None))
    return console.export_text()


def test_the_goal_adds_its_columns_and_the_choice_closes_the_table() -> None:
    goal = TrainingGoal.of("deadline", train_samples=1e6, deadline_s=3600.0, gpu_hour_price_usd=2.0)
    rows = []
    for gpus, rate, measured in ((2, 200.0, 190.0), (4, 390.0, None), (8, 700.0, None)):
        candidate = resplit(PROBED, gpus, 16)
        assert candidate is not None
        seconds = 1e6 / (measured or rate)
        rows.append(
            ForecastRow(
                trial=3,
                probed=PROBED,
                candidate=candidate,
                gpus=gpus,
                nodes=1,
                predicted_samples_per_s=rate,
                measured_samples_per_s=measured,
                fits=True,
                time_to_train_s=seconds,
                cost_usd=goal.cost_usd(gpus, seconds),
                cost_basis="run",
                finishes=goal.finishes(seconds),
            )
        )
    ranked = rank(rows, goal)
    forecast = Forecast(
        study="s", goal=goal, world_sizes=[2, 4, 8], probed_world_sizes=[2], global_batch=16,
        gpus_per_node=8, observations=5, rows=ranked, choice=choice_line(ranked, goal),
    )  # fmt: skip
    text = render(forecast)
    assert "objective deadline" in text and "USD for the run" in text
    for header in ("GPUs", "samples/s", "/GPU", "error", "time", "USD", "in time"):
        assert header in text
    assert "190.0 m" in text and "+5%" in text  # measured at 2, with the prediction's error
    assert "390.0 p" in text and "700.0 p" in text
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    # 4 GPUs finish (43 min) more cheaply than 8 (24 min); 2 do not (88 min)
    words = " ".join(text.split())  # the choice may wrap at 80 columns
    assert words.endswith(
        "cheapest that finishes within 1h: z1 fp32 mb4x1 on 4 GPU(s), 390.0 samples/s "
        "(predicted); trains in 42m44s, $5.70"
    )
