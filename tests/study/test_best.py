"""The study's best trial: the confirmed winner, and a trial measured after the round."""

from __future__ import annotations

import pytest

from autotune.study import best, records
from autotune.study import confirmation as confirm
from tests.support.studies import best_label, study_with


def test_export_takes_the_confirmed_winner() -> None:
    study = study_with({"a": [0.20, 0.20], "b": [0.21, 0.21]})
    assert best_label(study) == "a"  # by the search's single probes
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=0, label="a", samples_per_s=[80.0, 70.0, 70.0]),
            confirm.Contender(trial=1, label="b", samples_per_s=[76.0, 77.0, 78.0]),
        ],
        rounds=2,
    )
    verdict.decide()
    verdict.after_trial = 1
    confirm.store(study, verdict)
    assert best_label(study) == "b"
    # a later trial that beats the confirmed mean outright wins
    faster = study_with({"c": [0.1, 0.1]}).trials[0]
    study.add_trial(faster)
    assert best_label(study) == "c"


def _measured(number: int, samples_per_s: float) -> records.TrialView:
    """Trial ``number``, measured in full at ``samples_per_s`` by its single probe."""
    from autotune.candidate import Candidate

    candidate = Candidate(
        precision="fp32",
        zero_stage=0,
        micro_batch_size=number,
        gradient_accumulation_steps=1,
        data_parallel_size=1,
    )
    record = records.TrialRecord(
        candidate=candidate,
        candidate_key=candidate.key,
        label=f"t{number}",
        status="ok",
        feasible=True,
    )
    return records.TrialView(number, "COMPLETE", samples_per_s, record, None)  # type: ignore[arg-type]


def _round_of_t3_over_t15() -> confirm.Confirmation:
    """t3 confirmed near 100 samples/s; t15, a lucky 120 in the search, a runner-up near 91."""
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=3, label="t3", samples_per_s=[100.0, 101.0, 99.0, 100.0]),
            confirm.Contender(trial=15, label="t15", samples_per_s=[120.0, 90.0, 92.0, 91.0]),
        ],
        rounds=3,
        after_trial=16,
    )
    verdict.decide()
    assert verdict.winner == 3
    return verdict


def test_a_trial_after_the_round_beats_the_winner_not_a_runner_up_the_round_ruled_out() -> None:
    verdict = _round_of_t3_over_t15()
    trials = [_measured(3, 100.0), _measured(15, 120.0)]
    decided = best.decide_best(trials, verdict)
    assert decided is not None and decided.trial == 3 and decided.confirmed
    assert decided.reason.startswith(
        "confirmed on the lower of the median and the mean of its search probe and 3 "
        "interleaved re-probe(s), among 2"
    )
    # t20, measured after the round, beats t3's interval: t20 is the best, not t15's old 120
    decided = best.decide_best([*trials, _measured(20, 110.0)], verdict)
    assert decided is not None and decided.trial == 20 and not decided.confirmed
    assert decided.samples_per_s == 110.0
    assert "measured after the confirmation round" in decided.reason
    # within t3's interval it does not
    decided = best.decide_best([*trials, _measured(20, 101.0)], verdict)
    assert decided is not None and decided.trial == 3


def test_a_winner_not_feasible_now_leaves_the_best_to_the_next_contender() -> None:
    verdict = _round_of_t3_over_t15()
    decided = best.decide_best([_measured(15, 120.0), _measured(7, 95.0)], verdict)
    assert decided is not None and decided.trial == 15 and decided.confirmed
    assert decided.samples_per_s == pytest.approx(91.5)
    assert "trial 3, is not feasible now" in decided.reason
    # no contender feasible: the fastest feasible, on its single probe
    decided = best.decide_best([_measured(7, 95.0), _measured(8, 97.0)], verdict)
    assert decided is not None and decided.trial == 8 and not decided.confirmed
    assert "no contender of the confirmation round is feasible" in decided.reason


def test_a_trial_set_aside_by_its_loss_check_is_never_the_best() -> None:
    """``run --verify strict``: the round's winner whose loss check differs leaves the best
    to the next contender, and the reason says so; unconfirmed, the next fastest."""
    verdict = _round_of_t3_over_t15()
    trials = [_measured(3, 100.0), _measured(15, 120.0)]
    decided = best.decide_best(trials, verdict, set_aside={3})
    assert decided is not None and decided.trial == 15 and decided.confirmed
    assert "the round's winner, trial 3, trains differently" in decided.reason
    assert decided.reason.endswith("set aside by the loss check (it differs): trial(s) 3")
    decided = best.decide_best([_measured(7, 95.0), _measured(8, 97.0)], None, set_aside={8})
    assert decided is not None and decided.trial == 7
    assert best.decide_best([_measured(8, 97.0)], None, set_aside={8}) is None
    # set aside a trial that is not feasible anyway: nothing to say
    decided = best.decide_best([_measured(7, 95.0)], None, set_aside={8})
    assert decided is not None and "set aside" not in decided.reason


def test_the_study_remembers_what_strict_checks_set_aside(tmp_path) -> None:
    import optuna

    from autotune.study import loss_checks as checks
    from tests.support.loss_checks import check

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db")
    differs = check(1, [8.3, 8.9, 9.5]).model_copy(update={"set_aside": True})
    checks.store(study, differs)
    checks.store(study, check(2, [8.301, 8.19, 8.102]))
    assert checks.set_aside(study) == {1}


def _measured_on(number: int, samples_per_s: float, gpus: int) -> records.TrialView:
    """:func:`_measured` at a world size of ``gpus``."""
    view = _measured(number, samples_per_s)
    candidate = view.record.candidate.model_copy(update={"data_parallel_size": gpus})
    record = view.record.model_copy(update={"candidate": candidate})
    return records.TrialView(number, "COMPLETE", samples_per_s, record, None)  # type: ignore[arg-type]


def test_the_goal_decides_across_world_sizes_and_a_round_of_another_goal_does_not() -> None:
    from autotune.training_goal import TrainingGoal

    cost = TrainingGoal.of("cost", gpu_hour_price_usd=1.0)
    trials = [_measured_on(4, 160.0, 2), _measured_on(1, 100.0, 1)]
    assert best.decide_best(trials, None).trial == 4
    decided = best.decide_best(trials, None, goal=cost)
    assert decided is not None and (decided.trial, decided.gpus) == (1, 1)
    assert decided.reason.startswith("cheapest of 2 feasible")
    # a round that ranked by throughput confirmed trial 0: under cost it does not decide
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=4, label="t4", gpus=2, samples_per_s=[160.0, 161, 159]),
            confirm.Contender(trial=1, label="t1", gpus=1, samples_per_s=[100.0, 101, 99]),
        ],
        rounds=2,
        after_trial=4,
    )
    verdict.decide()
    assert best.decide_best(trials, verdict).trial == 4
    stale = best.decide_best(trials, verdict, goal=cost)
    assert stale is not None and stale.trial == 1 and not stale.confirmed
    assert "the confirmation round ranked by throughput" in stale.reason
    # a trial after a cost round beats its winner only above its interval per GPU
    verdict.goal = cost
    verdict.decide()
    later = [*trials, _measured_on(5, 250.0, 4), _measured_on(6, 220.0, 2)]
    decided = best.decide_best(later, verdict, goal=cost)
    assert decided is not None and decided.trial == 6 and not decided.confirmed  # 110 per GPU
    assert best.decide_best(later[:3], verdict, goal=cost).trial == 1  # 62.5 per GPU: no
