"""What summary.md and the trial records say in words: the distance to the runner-up, how
the confirmation round chose, what the user must do, memory next to the raw bytes, and an
early-stopped probe over the limit as infeasible in every view."""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune.export._exporter import export
from autotune.export._summary import outcome_counts, runner_up_distance, standings
from autotune.study import best, records
from autotune.study import confirmation as confirm
from autotune.views._dashboard import trial_note
from autotune.views._report_data import INFEASIBLE, point_of
from tests.views.synthetic import LIMIT, MIB, NAME, _candidate, _result


def test_summary_says_the_distance_and_what_to_do(synthetic: str, tmp_path: Path) -> None:
    study = optuna.load_study(study_name=NAME, storage=synthetic)
    summary = Path(export(study, tmp_path / "out").summary).read_text()
    assert (
        "- The runner-up, trial 2 (z1 fp32 mb2x4 overlap=0), is 5.0% slower (90.0 vs 85.5 "
        "samples/s, confirmed estimate); their 95% intervals overlap: on this machine the two "
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


def test_summary_says_how_the_round_chose_and_on_how_many_probes(
    synthetic: str, tmp_path: Path
) -> None:
    study = optuna.load_study(study_name=NAME, storage=synthetic)
    summary = Path(export(study, tmp_path / "fastest").summary).read_text()
    # four probes of trial 0 behind the estimate: its search probe and three re-probes
    assert (
        "- Confirmed the fastest: 90.0 samples/s ±1.6 (95% interval), the lower of the median "
        "and the mean of its search probe and 3 interleaved re-probes; 90.0 samples/s in its "
        "search probe"
    ) in summary
    # trial 1 has the higher estimate but swings; trial 0 is within its noise and steady
    steadier = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=1, label="a", samples_per_s=[96.0, 80, 100, 78, 98]),
            confirm.Contender(trial=0, label="b", samples_per_s=[90.0, 89, 91, 90, 90]),
        ],
        rounds=4,
        after_trial=9,
    )
    steadier.decide()
    assert (steadier.winner, steadier.steadier_over) == (0, 1)
    confirm.store(study, steadier)
    best.store(study, best.of_study(study))
    summary = Path(export(study, tmp_path / "steadier").summary).read_text()
    assert "Confirmed the fastest" not in summary
    assert (
        "- Chosen by the confirmation round as the steadier: within noise of trial 1's "
        "higher estimate and markedly steadier; 90.0 samples/s"
    ) in summary
    # within noise and at most 2% behind, trial 0 has fewer moving parts than trial 1
    simpler = confirm.Confirmation(
        contenders=[
            confirm.Contender(
                trial=1,
                label="a",
                samples_per_s=[96.0, 92, 97, 94],
                moving_parts=[1, 0, 0, 1, 1, 0],
            ),
            confirm.Contender(
                trial=0,
                label="b",
                samples_per_s=[94.0, 93, 94, 95],
                moving_parts=[0, 0, 0, 0, 2, 0],
            ),
        ],
        rounds=3,
        after_trial=9,
    )
    simpler.decide()
    assert (simpler.winner, simpler.simpler_over) == (0, 1)
    confirm.store(study, simpler)
    best.store(study, best.of_study(study))
    assert "the simpler within noise of the fastest (no offload)" in best.of_study(study).reason
    summary = Path(export(study, tmp_path / "simpler").summary).read_text()
    assert (
        "- Chosen by the confirmation round as the simpler: within noise of trial 1's higher "
        "estimate, with fewer moving parts (no offload); 94.0 samples/s"
    ) in summary
    assert "chose the simpler (no offload), which needs less host memory" in summary


def test_an_early_stopped_probe_over_the_limit_is_infeasible(synthetic: str) -> None:
    study = optuna.load_study(study_name=NAME, storage=synthetic)
    trial = study.ask()
    candidate = _candidate(0, 1, False, None).model_copy(update={"gradient_accumulation_steps": 4})
    record = records.TrialRecord(
        candidate=candidate,
        candidate_key=candidate.key + "-over",
        label=candidate.label,
        vram_limit_bytes=LIMIT,
    )
    records.record_probe(study, trial, record, _result("stopped", 50.0, 70))
    (over,) = [t for t in records.views(study) if t.number == trial.number]
    assert over.record.stopped_early and not over.record.feasible
    counts = outcome_counts(records.evaluations(records.views(study)))
    assert counts["feasible, stopped early as clearly slower than the best so far"] == 1
    assert counts["infeasible: measured peak above the limit"] == 1
    note = trial_note(over, None, None)
    assert "Stopped early" not in note and "**Infeasible**" in note
    assert point_of(over, None, None).kind == INFEASIBLE
    assert over.record.peak_bytes == 70 * MIB


def test_a_probe_over_host_ram_is_infeasible_and_says_why_in_every_view(synthetic: str) -> None:
    from autotune.views._status_table import _note

    study = optuna.load_study(study_name=NAME, storage=synthetic)
    trial = study.ask()
    candidate = _candidate(0, 1, False, None).model_copy(update={"gradient_accumulation_steps": 4})
    record = records.TrialRecord(
        candidate=candidate,
        candidate_key=candidate.key + "-host",
        label=candidate.label,
        vram_limit_bytes=LIMIT,
        host_ram_bytes=512 * MIB,
    )
    result = _result("ok", 99.0, 20).model_copy(
        update={
            "host_peak_bytes_per_rank": [300 * MIB, 300 * MIB],
            "host_peak_method": "sampled",
            "node_per_rank": ["vm", "vm"],
        }
    )
    records.record_probe(study, trial, record, result)
    (over,) = [t for t in records.views(study) if t.number == trial.number]
    why = (
        "measured host memory 600.00 MiB on node vm (2 rank(s)) is over --host-ram 512.00 MiB "
        "by 88.00 MiB (peak resident memory (sampled), summed over the node's ranks)"
    )
    assert over.status == "ok" and not over.feasible and over.record.error == why
    assert _note(over, None) == why[:120]  # the status table
    counts = outcome_counts(records.evaluations(records.views(study)))
    assert counts["infeasible: measured host memory above --host-ram"] == 1  # summary.md
    assert f"but {why}." in trial_note(over, None, None)  # the dashboard's note
    point = point_of(over, None, None)  # report.html
    assert point.kind == INFEASIBLE and point.why == why
    # the fastest probe of the study, but never ranked among the feasible
    ranked = records.ranked_feasible(records.views(study))
    assert ranked and over.number not in [t.number for t in ranked]


def test_summary_and_study_note_say_the_chosen_trials_loss_check(
    synthetic: str, tmp_path: Path
) -> None:
    """summary.md says how to check the chosen trial until it is checked, then the verdict
    with the losses step by step; optuna-dashboard's study note says the verdict."""
    from autotune.study import loss_checks as checks
    from autotune.views._dashboard import study_note
    from autotune.views._report_data import collect
    from tests.support.loss_checks import check

    study = optuna.load_study(study_name=NAME, storage=synthetic)
    decided = best.of_study(study)
    assert decided is not None
    before = Path(export(study, tmp_path / "before").summary).read_text()
    assert f"Not run. `autotune verify --study {NAME} --trial {decided.trial}`" in before
    assert "Loss check" not in study_note(collect(study), None)
    checks.store(study, check(decided.trial, [8.302, 8.19, 8.105]))
    summary = Path(export(study, tmp_path / "after").summary).read_text()
    assert "**drifts within the tolerance of bf16**" in summary
    assert "| 1 | 8.2 | 8.19 | 0.12% |" in summary
    assert (
        "**Loss check** against z0 fp32 mb4x1 (3 steps from one seed, autotune verify): "
        "drifts within the tolerance of bf16." in study_note(collect(study), None)
    )
