"""The confirmation round's statistics: contenders, the verdict, rounds and tie rounds."""

from __future__ import annotations

import pytest

from autotune.study import confirmation as confirm
from autotune.study import records
from tests.support.studies import study_with


def test_contenders_are_the_top_three_and_any_within_noise() -> None:
    study = study_with(
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
    assert "b: 69.0 samples/s ±3.1 (lower of median and mean of 3 probes" in verdict.describe()
    assert "they ranged 68.0..70.0" in verdict.describe()
    close = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=1, label="a", samples_per_s=[60.0, 66.0]),
            confirm.Contender(trial=2, label="b", samples_per_s=[61.0, 64.0]),
        ],
        rounds=1,
    )
    close.decide()
    # two probes each say too little about spreads: the higher estimate wins
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


def test_a_slow_mode_pulls_a_contender_down_where_its_median_would_not() -> None:
    """Three probes of a bimodal contender (CPU offload, two fast and one slow) and a steady
    one: the median (212) ranks the bimodal one 8% ahead, too few probes to call either
    steadier; the estimate, the lower of median and mean (192), ranks it behind, as a
    production run that pays the slow mode would."""
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=3, label="z1 mb8x1 opt:cpu", samples_per_s=[214, 150, 212]),
            confirm.Contender(trial=4, label="z0 mb8x1", samples_per_s=[195, 197, 196]),
        ],
        rounds=2,
    )
    verdict.decide()
    assert verdict.winner == 4 and verdict.steadier_over is None
    bimodal = next(c for c in verdict.contenders if c.trial == 3)
    assert bimodal.estimate == pytest.approx((214 + 150 + 212) / 3)


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
    assert verdict.contenders[1].estimate > verdict.contenders[0].estimate  # it led
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


def test_rounds_go_on_while_tied_up_to_the_plan() -> None:
    alternating = [100.0, 90.0, 110.0] * 10
    rates = {0: list(alternating), 1: [x - 1 for x in alternating]}
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=0, label="a", samples_per_s=[100.0]),
            confirm.Contender(trial=1, label="b", samples_per_s=[99.0]),
        ]
    )
    one_round, calls = _scripted_round(verdict, rates, probes=100)
    confirm.run_rounds(verdict, one_round)
    # the two stay within each other's noise: every round probes both, up to the plan's
    assert verdict.tie and verdict.rounds == confirm.ROUNDS + confirm.TIE_ROUNDS
    assert verdict.tie_rounds == 0 and calls == [[0, 1]] * len(calls)
    assert len(calls) == confirm.ROUNDS + confirm.TIE_ROUNDS


def test_while_tied_every_contender_in_the_race_is_probed_then_the_closest_two():
    """Three contenders stay within each other's noise after the first rounds: the rounds
    after them probe all three while a whole round fits; then the closest two get the rest."""
    scattered = [100.0, 85.0, 115.0, 92.0, 108.0] * 4
    rates = {t: [x - t for x in scattered] for t in range(3)}
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=t, label=str(t), samples_per_s=[100.0 - t]) for t in range(3)
        ]
    )
    one_round, calls = _scripted_round(verdict, rates, probes=3 * (confirm.ROUNDS + 2) + 2)
    confirm.run_rounds(verdict, one_round)
    assert calls[: confirm.ROUNDS + 2] == [[0, 1, 2]] * (confirm.ROUNDS + 2)
    assert verdict.rounds == confirm.ROUNDS + 2 and verdict.tie_rounds == 1
    assert len(calls[-1]) == 2 and len(calls) == confirm.ROUNDS + 3


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
    # 12 probes: two rounds of three, then three rounds of the two left in the race
    assert verdict.rounds == 5 and verdict.tie_rounds == 0
    assert sum(map(len, calls)) == 12
    assert verdict.winner == 0 and verdict.left_race == [2]
    assert "trial(s) 2 left the rounds early, out of the winner's noise" in verdict.describe()


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


def test_under_a_cost_objective_the_round_ranks_and_races_per_gpu() -> None:
    """A 2-GPU contender faster in samples/s but cheaper per GPU at 1 GPU: throughput picks
    the 2-GPU one, cost the 1-GPU one; their intervals compare per GPU, where they are
    apart."""
    from autotune.training_goal import TrainingGoal

    def contenders() -> list[confirm.Contender]:
        return [
            confirm.Contender(trial=1, label="a on 2", gpus=2, samples_per_s=[160.0, 161, 159]),
            confirm.Contender(trial=2, label="a on 1", gpus=1, samples_per_s=[100.0, 101, 99]),
        ]

    fastest = confirm.Confirmation(contenders=contenders())
    fastest.decide()
    cheapest = confirm.Confirmation(
        contenders=contenders(), goal=TrainingGoal.of("cost", gpu_hour_price_usd=1.0)
    )
    cheapest.decide()
    assert (fastest.winner, cheapest.winner) == (1, 2)
    winner, runner_up = cheapest.contenders
    assert not winner.overlaps(runner_up, cheapest.ranking)  # 100 vs 80 per GPU
    assert cheapest.racing() == [2]  # 80 per GPU cannot win any more
    assert "ranked by cost" in cheapest.describe() and "80.0 per GPU" in cheapest.describe()
    # the steadier rule compares means per GPU too: 80 per GPU gives up 20%, never steadier
    noisy_leader = confirm.Contender(
        trial=3, label="b on 1", gpus=1, samples_per_s=[100.0, 70, 130, 100]
    )
    steady = confirm.Contender(trial=4, label="b on 2", gpus=2, samples_per_s=[160.0] * 4)
    for contender in (noisy_leader, steady):
        contender.summarize()
    assert not confirm.markedly_steadier(steady, noisy_leader, cheapest.ranking)


def test_a_contender_that_misses_the_deadline_never_joins_by_overlap() -> None:
    """Three configurations that finish in time and a fourth that misses by its rate but
    whose noisy interval reaches the best's: under throughput it joins the round (within
    noise), under the deadline it does not (it cannot win: it does not finish)."""
    from autotune.training_goal import TrainingGoal

    goal = TrainingGoal.of("deadline", train_samples=3600.0, deadline_s=36.0)  # 100/s needed
    study = study_with(
        {
            "a": [16 / 130, 16 / 131, 16 / 129],
            "c": [16 / 125, 16 / 126, 16 / 124],
            "d": [16 / 120, 16 / 121, 16 / 119],
            "b": [16 / 300, 16 / 58, 16 / 58, 16 / 300],  # ~97 samples/s, wide
        }
    )
    by_throughput = records.ranked_feasible(records.views(study))
    by_deadline = records.ranked_feasible(records.views(study), goal)
    assert [t.label for t in by_deadline] == ["a", "c", "d", "b"]
    assert by_deadline[-1].value < 100.0
    assert [t.label for t in confirm.contenders(by_throughput)] == ["a", "c", "d", "b"]
    assert [t.label for t in confirm.contenders(by_deadline, goal)] == ["a", "c", "d"]


OFFLOAD = [1, 0, 0, 1, 1, 0]  # z1 opt:cpu mb16x1 (Candidate.moving_parts)
PLAIN = [0, 0, 0, 0, 2, 0]  # z0 mb8x2


def _pair(leader: list[float], plain: list[float], rounds: int = 3) -> confirm.Confirmation:
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(
                trial=4, label="z1 opt:cpu", samples_per_s=leader, moving_parts=OFFLOAD
            ),
            confirm.Contender(trial=7, label="z0 mb8x2", samples_per_s=plain, moving_parts=PLAIN),
        ],
        rounds=rounds,
    )
    verdict.decide()
    return verdict


def test_within_noise_the_simpler_contender_wins_and_its_pair_gets_the_tie_rounds() -> None:
    verdict = _pair([100.0, 92.0, 104.0, 95.0], [98.0, 97.0, 99.0, 96.0])
    assert verdict.winner == 7 and verdict.simpler_over == 4 and verdict.steadier_over is None
    assert verdict.simpler_reason() == "no offload"
    assert "higher estimate and simpler (no offload): chose the simpler" in verdict.describe()
    assert verdict.tie and verdict.closest() == [7, 4]  # the pair that decides the pick


@pytest.mark.parametrize(
    ("leader", "plain", "why"),
    [
        ([100.0, 100.5, 99.5, 100.0], [95.0, 95.5, 94.5, 95.0], "ahead by more than its noise"),
        ([100.0, 90.0, 110.0, 100.0], [94.0, 95.0, 93.0, 94.0], "within noise, 6% ahead"),
        ([100.0, 92.0, 104.0], [98.0, 97.0], "too few probes of the simpler to race"),
    ],
)
def test_the_faster_contender_keeps_the_win(
    leader: list[float], plain: list[float], why: str
) -> None:
    verdict = _pair(leader, plain)
    assert verdict.winner == 4 and verdict.simpler_over is None, why


def test_a_round_stored_without_the_simplicity_order_never_ranks_by_it() -> None:
    steady = _pair([100.0, 97.0, 102.0, 98.0], [98.0, 97.0, 99.0, 96.0])
    assert steady.winner == 7 and steady.simpler_over == 4
    stored = steady.model_dump(mode="json")
    for contender in stored["contenders"]:
        del contender["moving_parts"]
    verdict = confirm.Confirmation.model_validate(stored)
    verdict.decide()
    assert verdict.winner == 4 and verdict.simpler_over is None


def test_the_tie_rounds_go_to_the_simpler_contender_not_yet_within_the_loss_bound() -> None:
    """A simpler contender within noise but more than the bound behind: more rounds of the
    leader and it may show it within the bound, or apart."""
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(
                trial=1, label="a", samples_per_s=[100.0, 90.0, 110.0, 100.0], moving_parts=OFFLOAD
            ),
            confirm.Contender(
                trial=2,
                label="b",
                samples_per_s=[99.0, 80.0, 118.0, 99.0],
                moving_parts=[1, 1, 0, 3, 1, 0],
            ),
            confirm.Contender(
                trial=3, label="c", samples_per_s=[94.0, 95.0, 93.0, 94.0], moving_parts=PLAIN
            ),
        ],
        rounds=3,
    )
    verdict.decide()
    assert verdict.winner == 1 and verdict.closest() == [1, 3]


def test_a_contender_whose_re_probe_failed_leaves_the_race_and_does_not_win() -> None:
    """A contender leads on its one search probe, and its re-probe fails (out of memory,
    say): it gets no more probes and the winner is the best of those whose re-probes
    measured, not it on its one lucky probe."""
    rates = {0: [90.0, 91.0, 89.0] * 10, 1: [88.0, 87.0, 89.0] * 10}
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=2, label="lucky", samples_per_s=[120.0]),
            confirm.Contender(trial=0, label="a", samples_per_s=[90.0]),
            confirm.Contender(trial=1, label="b", samples_per_s=[88.0]),
        ]
    )
    by_trial = {c.trial: c for c in verdict.contenders}
    calls: list[list[int]] = []

    def one_round(trials: list[int]) -> bool:
        calls.append(trials)
        for trial in trials:
            if trial == 2:
                by_trial[2].failed_probes += 1
            else:
                by_trial[trial].samples_per_s.append(rates[trial].pop(0))
        return len(calls) < 30

    confirm.run_rounds(verdict, one_round)
    assert calls[0] == [2, 0, 1] and all(2 not in call for call in calls[1:])
    assert verdict.winner == 0 and verdict.contenders[-1].trial == 2
    assert "1 re-probe(s) failed" in verdict.describe()
