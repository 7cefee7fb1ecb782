"""What summary.md and the trial records say in words: the distance to the runner-up, what
the user must do, memory next to the raw bytes."""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune import confirm, records
from autotune.export import export
from autotune.summary import runner_up_distance, standings
from tests.views.synthetic import NAME


def test_summary_says_the_distance_and_what_to_do(synthetic: str, tmp_path: Path) -> None:
    study = optuna.load_study(study_name=NAME, storage=synthetic)
    summary = Path(export(study, tmp_path / "out").summary).read_text()
    assert (
        "- The runner-up, trial 2 (z1 fp32 mb2x4 overlap=0), is 5.0% slower (90.0 vs 85.5 "
        "samples/s, confirmed median); their 95% intervals overlap: on this machine the two "
        "are within noise." in summary
    )
    assert "rescale the learning rate" in summary
    assert "Keep activation checkpointing off" in summary


def test_distance_without_a_round_and_beyond_noise(synthetic: str) -> None:
    study = optuna.load_study(study_name=NAME, storage=synthetic)
    trials = records.views(study)
    rows = standings(trials, None, None)
    line = runner_up_distance(rows, None)
    assert line == (
        "The runner-up, trial 0 (z0 fp32 mb4x2), is 6.2% slower (96.0 vs 90.0 samples/s, "
        "one probe)."
    )
    assert runner_up_distance(rows[:1], None).startswith("No runner-up")
    apart = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=1, label="a", samples_per_s=[96.0, 95, 97]),
            confirm.Contender(trial=0, label="b", samples_per_s=[80.0, 81, 79]),
        ],
        rounds=2,
    )
    apart.decide()
    assert runner_up_distance(rows, apart).endswith("the difference is beyond noise.")


def test_records_carry_memory_in_words(synthetic: str) -> None:
    study = optuna.load_study(study_name=NAME, storage=synthetic)
    trials = records.views(study)
    assert trials[0].frozen.user_attrs[records.SCHEMA_ATTR] == records.SCHEMA_VERSION
    assert trials[0].record.memory == (
        "peak 40.00 MiB per rank (62% of 64.00 MiB); predicted 41.00 MiB"
    )
    assert trials[0].record.peak_pct_of_limit == 62.5
    pruned = trials[5].record
    assert pruned.memory == "predicted 900.00 MiB (1406% of the limit)"
    assert pruned.peak_pct_of_limit is None
