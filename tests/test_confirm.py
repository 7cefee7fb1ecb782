"""The confirmation round's statistics and how the export uses its verdict."""

from __future__ import annotations

import optuna
import pytest

from autotune import confirm
from autotune.export import best_trial


def _study_with(values: dict[str, list[float]]) -> optuna.Study:
    """One COMPLETE, feasible trial per label, with its timed steps."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    for label, step_times in values.items():
        trial = study.ask()
        rate = 16 / (sum(step_times) / len(step_times))
        for key, value in {
            "label": label,
            "feasible": True,
            "samples_per_s": rate,
            "step_times_s": step_times,
            "candidate_key": label,
        }.items():
            trial.set_user_attr(key, value)
        study.tell(trial, rate)
    return study


def test_contenders_are_the_top_three_and_any_within_noise() -> None:
    study = _study_with(
        {
            "a": [0.20, 0.21, 0.19],
            "b": [0.21, 0.22, 0.20],
            "c": [0.24, 0.25, 0.23],
            "d": [0.25, 0.55, 0.10],  # slower on average, but noisy: its interval reaches a's
            "e": [0.60, 0.61, 0.59],  # clearly slower
        }
    )
    from autotune.export import feasible_trials

    chosen = [t.user_attrs["label"] for t in confirm.contenders(feasible_trials(study))]
    assert chosen == ["a", "b", "c", "d"]


def test_verdict_mean_interval_and_tie() -> None:
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=1, label="a", samples_per_s=[60.0, 62.0, 61.0]),
            confirm.Contender(trial=2, label="b", samples_per_s=[66.0, 68.0, 67.0]),
        ],
        rounds=2,
    )
    verdict.decide()
    assert verdict.winner == 2
    first = verdict.contenders[0]
    assert first.mean == pytest.approx(67.0)
    assert first.half_width == pytest.approx(4.303 * 1.0 / 3**0.5)
    assert not verdict.tie  # 67 ± 2.5 vs 61 ± 2.5
    assert "b: 67.0 samples/s ±2.5 (95% interval, 3 probes)" in verdict.describe()
    close = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=1, label="a", samples_per_s=[60.0, 66.0]),
            confirm.Contender(trial=2, label="b", samples_per_s=[61.0, 64.0]),
        ],
        rounds=1,
    )
    close.decide()
    assert close.tie and "overlap within noise" in close.describe()


def test_reserve_is_bounded_by_a_quarter_of_the_budget() -> None:
    assert confirm.reserve_s(5.0, 10, 3600) == 3 * 3 * 5.0
    assert confirm.reserve_s(100.0, 10, 400) == 100.0


def test_export_takes_the_confirmed_winner() -> None:
    study = _study_with({"a": [0.20, 0.20], "b": [0.21, 0.21]})
    assert best_trial(study).user_attrs["label"] == "a"  # by the search's single probes
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=0, label="a", samples_per_s=[80.0, 70.0, 70.0]),
            confirm.Contender(trial=1, label="b", samples_per_s=[76.0, 77.0, 78.0]),
        ],
        rounds=2,
    )
    verdict.decide()
    verdict.after_trial = 1
    study.set_user_attr(confirm.CONFIRMATION_ATTR, verdict.model_dump(mode="json"))
    assert best_trial(study).user_attrs["label"] == "b"
    # a later trial that beats the confirmed mean outright wins
    faster = _study_with({"c": [0.1, 0.1]}).trials[0]
    study.add_trial(faster)
    assert best_trial(study).user_attrs["label"] == "c"
