"""The CLI's words for the events of a run."""

from __future__ import annotations

from autotune.cli._render import line
from autotune.run._confirmation_rounds import done_event
from autotune.study import confirmation as confirm


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


def test_a_probe_over_a_limit_says_it_is_infeasible_and_why() -> None:
    from autotune import events
    from autotune.protocol import ProbeResult

    result = ProbeResult(
        status="ok", samples_per_s=10.0, samples_per_s_min=9.0, samples_per_s_max=11.0
    )
    why = "measured host memory 6.00 GiB on node vm (2 rank(s)) is over --host-ram 4.00 GiB"
    text = line(events.ProbeFinished(3, "z2", result, 2**30, "log", over_limits=why))
    assert text.startswith("trial 3: z2 -> 10.0 samples/s")
    assert text.endswith(f"; infeasible: {why} [0 s]")
    assert "infeasible" not in line(events.ProbeFinished(3, "z2", result, 2**30, "log"))


def test_a_settled_search_says_what_it_compared_and_when_that_is_within_the_models_error() -> None:
    from autotune import events

    def settled(gap: float | None, error: float | None, probes: int) -> str:
        return line(
            events.SearchStopped(
                "settled", reserve_s=141.0, predicted_gap=gap, model_error=error, probes=probes
            )
        )

    assert settled(0.12, 0.04, 5) == (
        "search stopped: no open candidate is predicted within 5% of the best (the nearest "
        "12% below it; the cost model's leave-one-out error on this study's 5 probes ±4%), "
        "and the budget is short of the confirmation round's plan: its last 2m21s go to "
        "confirming the best"
    )
    assert settled(0.07, 0.11, 5).endswith(
        "; that gap is within the model's error: a longer --budget searches on"
    )
    assert settled(None, None, 2).startswith(
        "search stopped: no open candidate is predicted within 5% of the best, and the budget"
    )


def test_a_search_stopped_short_of_a_probe_says_so_not_that_the_budget_is_spent() -> None:
    from autotune import events

    short = events.SearchStopped(
        "budget", spent_s=304.0, total_s=420.0, left_s=116.0, probe_estimate_s=258.0
    )
    assert line(short) == (
        "search stopped: no time for another probe (5m4s of the study's 7m; 1m56s left, a "
        "probe takes about 4m18s)"
    )
    spent = events.SearchStopped("budget", spent_s=420.0, total_s=420.0)
    assert line(spent) == "search stopped: budget spent (7m of the study's 7m)"
