"""The confirmation round's statistics and how the export uses its verdict."""

from __future__ import annotations

import optuna
import pytest

from autotune.cli._render import line
from autotune.run import budget
from autotune.run._confirmation_rounds import done_event
from autotune.study import best, records
from autotune.study import confirmation as confirm


def _best_label(study: optuna.Study) -> str:
    decided = best.of_study(study)
    assert decided is not None
    return decided.label


def _study_with(values: dict[str, list[float]], **attrs: object) -> optuna.Study:
    """One COMPLETE, feasible trial per label, with its timed steps (and ``attrs``)."""
    from autotune.candidate import Candidate

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    for index, (label, step_times) in enumerate(values.items()):
        trial = study.ask()
        rate = 16 / (sum(step_times) / len(step_times))
        candidate = Candidate(
            precision="fp32",
            zero_stage=0,
            micro_batch_size=index + 1,
            gradient_accumulation_steps=1,
            data_parallel_size=1,
        )
        for key, value in {
            "candidate": candidate.model_dump(mode="json"),
            "label": label,
            "feasible": True,
            "samples_per_s": rate,
            "step_times_s": step_times,
            "candidate_key": label,
            "status": "ok",
            "probe_wall_s": 1.0,
            **attrs,
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
    ranked = records.ranked_feasible(records.views(study))
    chosen = [t.label for t in confirm.contenders(ranked)]
    assert chosen == ["a", "b", "c", "d"]


def test_verdict_median_interval_and_tie() -> None:
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=1, label="a", samples_per_s=[60.0, 62.0, 61.0]),
            confirm.Contender(trial=2, label="b", samples_per_s=[68.0, 70.0, 69.0]),
        ],
        rounds=2,
    )
    verdict.decide()
    assert verdict.winner == 2
    first = verdict.contenders[0]
    assert first.estimate == pytest.approx(69.0)
    # the median's standard error: sqrt(pi/2) x the mean's (stdev 1, 3 probes, t 4.303)
    assert first.half_width == pytest.approx(4.303 * 1.2533 * 1.0 / 3**0.5, rel=1e-3)
    assert not verdict.tie  # 69 ± 3.1 vs 61 ± 3.1
    assert "b: 69.0 samples/s ±3.1 (median of 3 probes" in verdict.describe()
    assert "they ranged 68.0..70.0" in verdict.describe()
    close = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=1, label="a", samples_per_s=[60.0, 66.0]),
            confirm.Contender(trial=2, label="b", samples_per_s=[61.0, 64.0]),
        ],
        rounds=1,
    )
    close.decide()
    # two probes each say too little about spreads: the higher median wins
    assert close.winner == 1 and close.steadier_over is None
    assert close.tie and "overlap within noise" in close.describe()


def test_one_lucky_probe_moves_the_median_little() -> None:
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=1, label="a", samples_per_s=[100.0, 101.0, 99.0, 100.5]),
            confirm.Contender(trial=2, label="b", samples_per_s=[97.0, 98.0, 140.0, 97.5]),
        ],
        rounds=3,
    )
    verdict.decide()
    # b's mean (108) is above a's, one lucky probe; its median (97.75) is not
    assert verdict.winner == 1


def test_within_noise_the_steadier_contender_wins() -> None:
    """A bimodal contender (CPU offload measured 150..214 here) whose median leads, and a
    steady one within its noise: the steady one is chosen, and the verdict says so."""
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(
                trial=3, label="z1 mb8x1 opt:cpu", samples_per_s=[214, 150, 212, 209, 152, 213]
            ),
            confirm.Contender(
                trial=4, label="z0 mb8x1", samples_per_s=[190, 188, 192, 189, 191, 190]
            ),
        ],
        rounds=5,
    )
    verdict.decide()
    assert verdict.contenders[1].estimate > verdict.contenders[0].estimate  # it led by median
    assert verdict.winner == 4 and verdict.steadier_over == 3
    assert "chose the steadier" in verdict.describe()
    # far apart, steadiness does not matter: the faster wins
    apart = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=3, label="fast", samples_per_s=[300, 250, 310, 305, 255]),
            confirm.Contender(trial=4, label="steady", samples_per_s=[190, 191, 189, 190, 190]),
        ],
        rounds=4,
    )
    apart.decide()
    assert apart.winner == 3 and apart.steadier_over is None


def test_reserve_covers_every_contender_and_the_tie_break() -> None:
    tie_break = 2 * confirm.TIE_ROUNDS
    # before the search has contenders: planned for the top three
    assert confirm.reserve_s(5.0, 0, 3600) == (3 * 3 + tie_break) * 5.0
    # four contenders within noise: three rounds of all four
    assert confirm.reserve_s(5.0, 4, 3600) == (3 * 4 + tie_break) * 5.0
    # never more than MAX_CONTENDERS, never more than 40% of the budget
    assert confirm.reserve_s(5.0, 9, 3600) == (3 * confirm.MAX_CONTENDERS + tie_break) * 5.0
    assert confirm.reserve_s(100.0, 4, 400) == pytest.approx(0.4 * 400)


def _scripted_round(verdict: confirm.Confirmation, rates: dict[int, list[float]], probes: int):
    """A ``one_round`` for :func:`confirm.run_rounds` with room for ``probes`` probes; each
    probe of a trial returns its next scripted samples/s. Also returns the rounds it ran."""
    by_trial = {c.trial: c for c in verdict.contenders}
    calls: list[list[int]] = []

    def one_round(trials: list[int]) -> bool:
        nonlocal probes
        if len(trials) > probes:
            return False
        probes -= len(trials)
        calls.append(trials)
        for trial in trials:
            by_trial[trial].samples_per_s.append(rates[trial].pop(0))
        return True

    return one_round, calls


def test_when_a_full_round_no_longer_fits_the_best_two_get_the_time_left() -> None:
    rates = {t: [100.0 - t, 90.0 - t, 110.0 - t, 95.0 - t, 105.0 - t] for t in range(4)}
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=t, label=str(t), samples_per_s=[100.0 - t]) for t in range(4)
        ]
    )
    one_round, calls = _scripted_round(verdict, rates, probes=10)
    confirm.run_rounds(verdict, one_round)
    # two rounds of all four (8 probes); a third does not fit, a round of two does: the
    # leader and the widest-spread contender within its noise (3 here, the least ranked)
    assert verdict.rounds == 2 and verdict.tie_rounds == 1
    spreads = {c.trial: c.spread for c in verdict.contenders}
    assert calls[-1][0] == 0 and len(calls[-1]) == 2 and len(calls) == 3
    assert spreads[calls[-1][1]] == max(spreads[t] for t in (1, 2, 3))


def test_when_no_round_of_every_contender_fits_the_best_two_get_the_reserve() -> None:
    # three contenders of one search probe each; room for two more probes
    rates = {0: [100.0, 92.0, 101.0, 93.0], 1: [98.0, 95.0, 99.0, 94.0], 2: [90.0] * 4}
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=t, label=str(t), samples_per_s=[rates[t].pop(0)])
            for t in range(3)
        ]
    )
    one_round, calls = _scripted_round(verdict, rates, probes=2)
    confirm.run_rounds(verdict, one_round)
    # no round of all three fits: the search's best two get the time
    assert verdict.rounds == 0 and calls == [[0, 1]] and verdict.tie_rounds == 1
    assert [len(c.samples_per_s) for c in verdict.contenders if c.trial != 2] == [2, 2]


def test_tie_rounds_go_on_while_the_budget_has_room() -> None:
    alternating = [100.0, 90.0, 110.0] * 5
    rates = {0: list(alternating), 1: [x - 1 for x in alternating]}
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=0, label="a", samples_per_s=[100.0]),
            confirm.Contender(trial=1, label="b", samples_per_s=[99.0]),
        ]
    )
    one_round, calls = _scripted_round(verdict, rates, probes=100)
    confirm.run_rounds(verdict, one_round)
    assert verdict.rounds == confirm.ROUNDS and verdict.tie
    assert verdict.tie_rounds == confirm.MAX_TIE_ROUNDS > confirm.TIE_ROUNDS
    assert len(calls) == confirm.ROUNDS + confirm.MAX_TIE_ROUNDS


def test_a_contender_out_of_the_winners_noise_leaves_the_race_and_its_time_goes_to_the_tie():
    """Racing: after two rounds trial 2 (steady near 60) is out of reach of the leaders (near
    100 and 98, scattered): the third round and the tie rounds probe only those two."""
    rates = {
        0: [92.0, 108.0, 95.0, 105.0, 94.0, 106.0, 96.0, 104.0, 98.0, 102.0],
        1: [91.0, 105.0, 93.0, 103.0, 92.0, 104.0, 94.0, 102.0, 96.0, 100.0],
        2: [60.0, 61.0, 60.5, 61.0, 60.0, 61.0, 60.5, 61.0, 60.0, 61.0],
    }
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=0, label="a", samples_per_s=[100.0]),
            confirm.Contender(trial=1, label="b", samples_per_s=[98.0]),
            confirm.Contender(trial=2, label="c", samples_per_s=[60.5]),
        ]
    )
    one_round, calls = _scripted_round(verdict, rates, probes=12)
    confirm.run_rounds(verdict, one_round)
    assert calls[0] == calls[1] == [0, 1, 2]  # interleaved, in the same order
    assert all(2 not in call for call in calls[2:]), calls
    # 12 probes: two rounds of three, then three rounds of the two (one a tie round's)
    assert verdict.rounds == confirm.ROUNDS and verdict.tie_rounds == 2
    assert sum(map(len, calls)) == 12
    assert verdict.winner == 0 and verdict.left_race == [2]
    assert "trial(s) 2 left the rounds early, out of the winner's noise" in verdict.describe()


def test_export_takes_the_confirmed_winner() -> None:
    study = _study_with({"a": [0.20, 0.20], "b": [0.21, 0.21]})
    assert _best_label(study) == "a"  # by the search's single probes
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
    assert _best_label(study) == "b"
    # a later trial that beats the confirmed mean outright wins
    faster = _study_with({"c": [0.1, 0.1]}).trials[0]
    study.add_trial(faster)
    assert _best_label(study) == "c"


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
        "confirmed on the median of its search probe and 3 interleaved re-probe(s), among 2"
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


def _tuner(tmp_path, space_yaml: str | None = None, executor=None, **settings: object):
    """A Tuner on gpt-tiny with 2 ranks, its study in ``tmp_path``; ``space_yaml`` the text
    of its space file, ``executor`` the stand-in every probe goes to."""
    from autotune.run._plan import plan_run
    from autotune.run._tuner import Tuner
    from autotune.settings import RunSettings

    if space_yaml is not None:
        space = tmp_path / "space.yaml"
        space.write_text(space_yaml)
        settings["space"] = str(space)
    built = RunSettings.build(
        workload="gpt-tiny",
        gpus=2,
        trials_dir=tmp_path / "trials",
        storage_url=f"sqlite:///{tmp_path}/t.db",
        **settings,
    )
    factory = (lambda plan: executor) if executor is not None else None
    return Tuner(plan_run(built), executor_factory=factory)


def _load(tmp_path) -> optuna.Study:
    return optuna.load_study(study_name="gpt-tiny", storage=f"sqlite:///{tmp_path}/t.db")


class ScriptedExecutor:
    """Stands in for the probes, by design: the decision logic under test needs chosen
    throughputs (a tie that persists), which real probes on a noisy machine cannot be made
    to produce on demand. Each probe of a label returns its next scripted samples/s."""

    capacity = 1

    def __init__(self, rates: dict[str, list[float]]) -> None:
        self.rates = {label: list(values) for label, values in rates.items()}
        self.order: list[str] = []
        self.stop_below: list[float] = []  # each probe's early-stop threshold (0: none)
        self._done: list[tuple[int, object]] = []

    def submit(self, job) -> int:
        from autotune.protocol import ProbeResult

        label = job.spec.candidate.label
        self.order.append(label)
        self.stop_below.append(job.spec.stop_below_samples_per_s)
        values = self.rates[label]
        rate = values.pop(0) if len(values) > 1 else values[0]
        batch = job.spec.candidate.train_batch_size
        result = ProbeResult(
            status="ok",
            samples_per_s=rate,
            samples_per_s_min=rate,
            samples_per_s_max=rate,
            step_time_s=batch / rate,
            step_times_s=[batch / rate] * 3,
            peak_bytes_per_rank=[2**20, 2**20],
            wall_s=1.0,
        )
        self._done.append((len(self.order), result))
        return len(self.order)

    def wait(self, timeout_s: float):
        done, self._done = self._done, []
        return done

    def cancel_all(self) -> None: ...

    def close(self) -> None: ...


@pytest.mark.parametrize("tied", [True, False])
def test_a_tie_between_the_best_two_gets_more_rounds_of_those_two(tmp_path, tied) -> None:
    from autotune.study import confirmation as confirm

    # z0 and z1 alternate around 100 and 97 (a tie that never separates); z2 is far behind
    close = [100.0, 92.0, 108.0, 92.0, 108.0, 92.0, 108.0, 92.0, 108.0]
    rival = [97.0, 89.0, 105.0, 89.0, 105.0, 89.0, 105.0, 89.0, 105.0]
    rival = rival if tied else [60.0, 61.0, 60.5, 60.2]
    scripted = ScriptedExecutor(
        {"z0 fp32 mb8x1": close, "z1 fp32 mb8x1": rival, "z2 fp32 mb8x1": [50.0, 50.5, 49.5]}
    )
    tuner = _tuner(
        tmp_path,
        "precision: [fp32]\nzero_stage: [0, 1, 2]\noffload_optimizer: [none]\n"
        "offload_param: [none]\nmicro_batch_size: [8]\ngradient_accumulation_steps: [1]\n"
        "activation_checkpointing: [false]\n",
        scripted,
        budget_s=600,
        early_stop=False,
    )
    run = tuner.run()
    verdict = confirm.load(_load(tmp_path))
    assert verdict is not None and run.confirmation == verdict  # the run returns it typed
    confirmation_probes = scripted.order[3:]
    # two rounds of all three; z2 then is out of the winner's noise and leaves the race
    assert "z2 fp32 mb8x1" not in confirmation_probes[6:]
    if tied:
        # the budget has room: every tie round allowed, of the best two only
        assert verdict.rounds == confirm.ROUNDS
        assert verdict.tie_rounds == confirm.MAX_TIE_ROUNDS and verdict.tie
        extra = confirmation_probes[3 + 3 + 2 :]
        assert len(extra) == 2 * confirm.MAX_TIE_ROUNDS and "z2 fp32 mb8x1" not in extra
        assert "more round(s) of the two closest" in verdict.describe()
        summary = (tmp_path / "trials" / "gpt-tiny" / "best" / "summary.md").read_text()
        assert f"then {confirm.MAX_TIE_ROUNDS} more of the two closest to rank them" in summary
        z2 = next(c.trial for c in verdict.contenders if c.label == "z2 fp32 mb8x1")
        assert verdict.left_race == [z2]
        assert f"trial(s) {z2} left the rounds early, out of the winner's noise" in summary
    else:
        # z1 leaves the race with z2: the winner stands apart after two rounds
        assert verdict.rounds == 2 and verdict.tie_rounds == 0 and not verdict.tie
        assert len(confirmation_probes) == 3 * 2
    study = _load(tmp_path)
    assert study.trials[verdict.winner].user_attrs["label"] == "z0 fp32 mb8x1"


def _reserve(study: optuna.Study, covered: bool = True) -> float:
    """The reserve the tuner holds for ``study`` (search.Search._update_estimates)."""
    trials = records.views(study)
    ranked = records.ranked_feasible(trials)
    return budget.ReservePolicy().reserve_s(
        feasible=len(ranked),
        stages_covered=covered,
        contenders=len(confirm.contenders(ranked)),
        full_probe_s=budget.probe_estimate_s(trials, full_only=True),
        probe_s=budget.probe_estimate_s(trials),
        budget_s=3600,
    )


def test_the_reserve_is_timed_by_full_length_probes_for_the_contenders_left() -> None:
    """Confirmation probes never stop early: the reserve is timed by the probes that ran in
    full (an early-stopped probe is a fraction of one), for every contender within noise."""
    # four candidates within noise of each other, each probed in full in 3 s
    study = _study_with(
        {
            "a": [0.20, 0.26, 0.16],
            "b": [0.21, 0.27, 0.17],
            "c": [0.21, 0.26, 0.18],
            "d": [0.22, 0.28, 0.17],
        },
        probe_wall_s=3.0,
    )
    # and five probes that stopped early after 0.5 s: they do not time a confirmation probe
    for index in range(5):
        stopped = study.ask()
        attrs = {"label": f"s{index}", "candidate_key": f"s{index}", "probe_wall_s": 0.5}
        attrs["candidate"] = study.trials[0].user_attrs["candidate"]
        for key, value in {**attrs, "status": "ok", "stopped_early": True}.items():
            stopped.set_user_attr(key, value)
        study.tell(stopped, 1.0)
    assert budget.probe_estimate_s(records.views(study)) == 0.5
    assert _reserve(study) == (confirm.ROUNDS * 4 + 2 * confirm.TIE_ROUNDS) * 3.0
    # a warm worker's first probe paid the group's start: once warm probes exist, it is left
    # out of both estimates
    cold = study.ask()
    cold.set_user_attr("candidate", study.trials[0].user_attrs["candidate"])
    for key, value in {"probe_wall_s": 30.0, "status": "ok", "probe_cold_start": True}.items():
        cold.set_user_attr(key, value)
    study.tell(cold, state=optuna.trial.TrialState.FAIL)
    assert budget.probe_estimate_s(records.views(study), full_only=True) == 3.0
    # with one feasible config there is nothing to confirm: no time is held back
    lone = _study_with({"a": [0.2, 0.2, 0.2]}, probe_wall_s=3.0)
    assert _reserve(lone) == 0.0
    # nor before every ZeRO stage that may fit has had its probe
    assert _reserve(study, covered=False) == 0.0
    # before any warm probe, the cold ones are all there is
    only_cold = _study_with({"a": [0.2, 0.2, 0.2]}, probe_wall_s=30.0, probe_cold_start=True)
    assert budget.probe_estimate_s(records.views(only_cold)) == 30.0


def test_a_stages_first_probe_is_never_stopped_early(tmp_path) -> None:
    """Stage coverage gives each ZeRO stage one probe before the rest; that probe is the
    stage's only evidence, so it runs in full whatever the best so far."""
    rates = {
        f"z{z} fp32 mb{m}x{8 // m}": [100.0 / (1 + z + 8 // m)] for z in (0, 1) for m in (2, 4, 8)
    }
    scripted = ScriptedExecutor(rates)
    tuner = _tuner(
        tmp_path,
        "precision: [fp32]\nzero_stage: [0, 1]\noffload_optimizer: [none]\n"
        "offload_param: [none]\nmicro_batch_size: [2, 4, 8]\n"
        "activation_checkpointing: [false]\n",
        scripted,
        global_batch=16,
        budget_s=600,
        confirm=False,
    )
    tuner.run()
    assert len(scripted.order) == 6
    first_of_stage = {}
    for label, threshold in zip(scripted.order, scripted.stop_below, strict=True):
        first_of_stage.setdefault(label[:2], threshold)
    assert first_of_stage == {"z0": 0.0, "z1": 0.0}
    assert any(threshold > 0 for threshold in scripted.stop_below)  # the others may stop


def test_stage_coverage_decides_when_the_reserve_starts(tmp_path) -> None:
    """On a short budget the reserve would end the search after two configs; it waits for
    autotune's least search, one probe of every ZeRO stage that may fit."""
    from autotune.candidate import Candidate
    from autotune.run.sampler import History

    tuner = _tuner(
        tmp_path,
        "precision: [fp32]\nzero_stage: [0, 1]\noffload_optimizer: [none]\n"
        "offload_param: [none]\nmicro_batch_size: [4, 8]\nactivation_checkpointing: [false]\n",
        global_batch=16,
    )
    _, policy = tuner.make_sampler()
    assert policy is not None

    def candidate(stage: int, micro_batch: int) -> dict[str, object]:
        return Candidate(
            precision="fp32",
            zero_stage=stage,
            micro_batch_size=micro_batch,
            gradient_accumulation_steps=8 // micro_batch,
            data_parallel_size=2,
        ).model_dump(mode="json")

    # two feasible ZeRO-1 configs, ZeRO-0 not probed yet
    study = _study_with({"a": [0.2, 0.2, 0.2]}, probe_wall_s=3.0, candidate=candidate(1, 8))
    study.add_trial(
        _study_with({"b": [0.3, 0.3, 0.3]}, probe_wall_s=3.0, candidate=candidate(1, 4)).trials[0]
    )
    assert not policy.covered(History.of(records.views(study)))
    study.add_trial(
        _study_with({"c": [0.4, 0.4, 0.4]}, probe_wall_s=3.0, candidate=candidate(0, 4)).trials[0]
    )
    assert policy.covered(History.of(records.views(study)))


def test_one_winner_everywhere_when_the_confirmed_winner_is_not_the_raw_maximum(
    tmp_path,
) -> None:
    """The search's fastest single measurement (z1, a lucky 110) loses the confirmation to
    z0: the run's export, ``autotune export``, ``autotune status``'s ``*`` and the study's
    ``autotune_best`` (what optuna-dashboard shows) all name z0, and no re-probe is a trial
    of its own, so none can pose as a better trial in the dashboard."""
    import json

    from tests.conftest import run_cli

    scripted = ScriptedExecutor(
        {
            "z0 fp32 mb8x1": [100.0, 104.0, 106.0, 105.0, 104.0, 106.0, 105.0],
            "z1 fp32 mb8x1": [110.0, 90.0, 91.0, 89.0, 90.0, 91.0, 89.0],
            "z2 fp32 mb8x1": [50.0, 50.5, 49.5],
        }
    )
    tuner = _tuner(
        tmp_path,
        "precision: [fp32]\nzero_stage: [0, 1, 2]\noffload_optimizer: [none]\n"
        "offload_param: [none]\nmicro_batch_size: [8]\ngradient_accumulation_steps: [1]\n"
        "activation_checkpointing: [false]\n",
        scripted,
        budget_s=600,
        early_stop=False,
    )
    summary = tuner.run()
    study = _load(tmp_path)
    raw_max = max(study.trials, key=lambda t: t.value or 0.0)
    assert raw_max.user_attrs["label"] == "z1 fp32 mb8x1"
    assert summary.best is not None and summary.best.confirmed
    assert summary.best.label == "z0 fp32 mb8x1"
    assert study.user_attrs[best.BEST_ATTR]["trial"] == summary.best.trial
    assert len(study.trials) == 3  # the re-probes are in the verdict, not trials
    run_config = (tmp_path / "trials" / "gpt-tiny" / "best" / "ds_config.json").read_text()
    storage = f"sqlite:///{tmp_path}/t.db"
    exported = run_cli("export", "-o", "out", "--storage", storage, cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert f"trial {summary.best.trial} (z0 fp32 mb8x1) exported" in exported.stdout
    assert json.loads((tmp_path / "out" / "ds_config.json").read_text()) == json.loads(run_config)
    status = run_cli("status", "--storage", storage, cwd=tmp_path, env={"COLUMNS": "250"})
    rows = [line.split("│") for line in status.stdout.splitlines() if line.count("│") > 2]
    starred = [row for row in rows if "*" in row[1]]
    assert len(starred) == 1 and "z0 fp32 mb8x1" in starred[0][3], status.stdout


def test_a_leader_ahead_on_the_mean_keeps_the_win_over_a_steadier_one() -> None:
    """A DeepSpeed-comparison run's round: z0's four probes spread ±10% (one slow probe),
    z1 with CPU offload ±2%, within z0's noise and steadier beyond chance; but z0's mean,
    its slow probe included, is 8.8% ahead: z0 is faster on the whole and stays the winner
    (the grid's best by the common harness)."""
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(
                trial=2, label="z1 bf16 mb8x1 opt:cpu", samples_per_s=[297.5, 312.6, 309.2, 310.6]
            ),
            confirm.Contender(
                trial=3, label="z0 bf16 mb8x1", samples_per_s=[367.0, 330.5, 354.0, 286.6]
            ),
        ],
        rounds=3,
    )
    for contender in verdict.contenders:
        contender.summarize()
    z1, z0 = verdict.contenders
    assert z1.overlaps(z0) and (z0.spread / z1.spread) ** 2 > confirm.f_quantile(3, 3)
    verdict.decide()
    assert verdict.winner == 3 and verdict.steadier_over is None


def test_the_tuner_exports_the_steadier_of_two_within_noise(tmp_path) -> None:
    """Scripted probes (a stand-in, by design: real probes cannot be made bimodal on
    demand): a CPU-offload config whose probes land in two modes, 150 and ~212, leads by
    its median; a steady config at ~190 is within its noise. The steady one is exported,
    and summary.md says why."""
    # its mean (194) and median (212) both beat the steady 190
    bimodal = [214.0, 150.0, 213.0, 212.0, 152.0, 214.0, 213.0, 150.0, 212.0, 211.0]
    steady = [190.0, 188.0, 192.0, 189.0, 191.0, 190.0, 189.5, 190.5, 191.0, 189.0]
    scripted = ScriptedExecutor(
        {"z1 fp32 mb8x1 opt:cpu": bimodal, "z0 fp32 mb8x1": steady, "z1 fp32 mb8x1": [120.0]}
    )
    tuner = _tuner(
        tmp_path,
        "precision: [fp32]\nzero_stage: [0, 1]\noffload_optimizer: [none, cpu]\n"
        "offload_param: [none]\nmicro_batch_size: [8]\ngradient_accumulation_steps: [1]\n"
        "activation_checkpointing: [false]\n",
        scripted,
        budget_s=600,
        early_stop=False,
    )
    summary = tuner.run()
    assert summary.best is not None and summary.best.label == "z0 fp32 mb8x1"
    verdict = confirm.load(_load(tmp_path))
    assert verdict is not None and verdict.steadier_over is not None
    text = (tmp_path / "trials" / "gpt-tiny" / "best" / "summary.md").read_text()
    assert "chose the steadier" in text and "z1 fp32 mb8x1 opt:cpu" in text


def test_the_f_quantile_is_close_to_the_tables_and_conservative() -> None:
    """Paulson's approximation against the F distribution's exact 95% quantiles."""
    exact = {(3, 3): 9.277, (5, 5): 5.050, (9, 9): 3.179, (3, 9): 3.863, (9, 3): 8.812}
    for (d1, d2), value in exact.items():
        approx = confirm.f_quantile(d1, d2)
        assert value * 0.99 <= approx <= value * 1.07, (d1, d2, approx)


def test_chance_spreads_of_a_few_probes_do_not_make_a_contender_steadier() -> None:
    leader = confirm.Contender(trial=1, label="a", samples_per_s=[100.0, 92.0, 108.0, 95.0])
    calm = confirm.Contender(trial=2, label="b", samples_per_s=[96.0, 100.0, 94.0, 99.0])
    for contender in (leader, calm):
        contender.summarize()
    # half the spread (a quarter of the variance): what chance gives 4 probes now and then
    assert not confirm.markedly_steadier(calm, leader)
    steady = confirm.Contender(trial=3, label="c", samples_per_s=[97.0, 97.2, 96.9, 97.1])
    steady.summarize()
    assert confirm.markedly_steadier(steady, leader)


def test_the_cli_words_the_verdict_the_round_reports() -> None:
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=1, label="a", samples_per_s=[60.0, 62.0, 61.0]),
            confirm.Contender(trial=2, label="b", samples_per_s=[68.0, 70.0, 69.0]),
        ],
        rounds=2,
        seconds=31.4,
    )
    verdict.decide()
    text = line(done_event(verdict))
    assert text == f"confirmation (2 round(s), 31 s): {verdict.describe()}"
    assert text.startswith("confirmation (2 round(s), 31 s): winner b: 69.0 samples/s ±3.1")
