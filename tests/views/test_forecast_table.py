"""``autotune plan --study S --gpus N`` on the package's real study (2 CPU ranks): its
configurations at other world sizes from its fitted cost model, measured where it probed
them (with the prediction's error), predicted elsewhere; ranked by the objective."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import run_cli
from tests.views.conftest import RealStudy

pytestmark = pytest.mark.slow


def plan(real_study: RealStudy, *args: str) -> tuple[int, str, str]:
    result = run_cli(
        "plan", "--study", "gpt-tiny", "--storage", real_study.storage, *args,
        cwd=real_study.folder,
    )  # fmt: skip
    return result.returncode, result.stdout, result.stderr


def test_rows_at_the_probed_world_size_are_measured_the_others_predicted(
    real_study: RealStudy,
) -> None:
    code, out, err = plan(real_study, "--gpus", "1,2,4", "--json")
    assert code == 0, out + err
    document = json.loads(out)
    assert document["kind"] == "autotune.forecast"
    assert document["probed_world_sizes"] == [2] and document["world_sizes"] == [1, 2, 4]
    assert document["observations"] >= 1
    rows = document["rows"]
    assert {row["gpus"] for row in rows} == {1, 2, 4}

    def batch(row: dict) -> int:
        candidate = row["candidate"]
        return candidate["micro_batch_size"] * candidate["gradient_accumulation_steps"]

    for row in rows:
        assert row["candidate"]["data_parallel_size"] == row["gpus"]
        assert batch(row) * row["gpus"] == batch(rows[0]) * rows[0]["gpus"]  # one global batch
        assert row["predicted_samples_per_s"] > 0
        if row["gpus"] == 2:  # the study's own probes: measured, the model's error beside
            assert row["samples_per_s_kind"] == "measured"
            expected = row["predicted_samples_per_s"] / row["measured_samples_per_s"] - 1
            assert row["measured_error"] == pytest.approx(expected)
        else:
            assert row["samples_per_s_kind"] == "predicted" and row["measured_error"] is None
    fitting = [row["samples_per_s"] for row in rows if row["fits"]]
    assert fitting == sorted(fitting, reverse=True)  # throughput: fastest first
    assert document["choice"].startswith("fastest: ")


def test_a_deadline_none_meets_names_the_fastest_and_its_time(real_study: RealStudy) -> None:
    goal = ["--objective", "deadline", "--train-samples", "1M", "--deadline", "1s"]
    code, out, err = plan(real_study, "--gpus", "1-2", *goal, "--gpu-hour-price", "3", "--json")
    assert code == 0, out + err
    document = json.loads(out)
    assert document["goal"]["deadline_s"] == 1.0 and document["goal"]["train_samples"] == 1e6
    assert document["choice"].startswith("none finishes within 1s: the fastest, ")
    assert "; trains in " in document["choice"] and ", $" in document["choice"]
    for row in document["rows"]:
        seconds = 1e6 / row["samples_per_s"]
        assert row["time_to_train_s"] == pytest.approx(seconds)
        assert row["cost_usd"] == pytest.approx(3.0 * row["gpus"] * seconds / 3600)
        assert row["cost_basis"] == "run" and row["finishes"] is False


def test_a_cost_objective_without_a_price_is_one_line(real_study: RealStudy) -> None:
    code, _, err = plan(real_study, "--gpus", "4", "--objective", "cost")
    assert code == 2
    assert err.strip() == (
        "autotune: error: --objective cost needs --gpu-hour-price USD (the price of one GPU "
        "for an hour)"
    )
