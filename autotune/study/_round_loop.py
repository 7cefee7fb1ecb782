"""The confirmation round's loop: which contenders each round probes, and when it ends
(:func:`run_rounds`; the rounds on real probes are :mod:`autotune.run`'s, the verdict
:class:`~autotune.study.confirmation.Confirmation`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from autotune.study.confirmation import Confirmation

ROUNDS = 3  # whole rounds of every contender still in the race, always
# Rounds after those while the winner overlaps another, at most: the round's plan holds
# them as rounds of two (autotune.run.budget.planned_probes). Candidates within a few
# percent of each other at a probe's noise need tens of probes each to rank:
# benchmarks/RESULTS.md, "A short study in seconds".
TIE_ROUNDS = 20


def run_rounds(verdict: Confirmation, one_round: Callable[[list[int]], bool]) -> None:
    """Drive the round: :data:`ROUNDS` interleaved rounds of every contender still in the
    race (:meth:`Confirmation.racing`: a contender out of the winner's noise gets no more
    probes, its time goes to the close calls), then, while the winner overlaps another, up
    to :data:`TIE_ROUNDS` more: of every contender still in the race while a whole round of
    them fits, then of the winner and the contender that decides the pick
    (:meth:`Confirmation.closest`) while theirs does. ``one_round(trials)`` probes those
    contenders once each and appends to their samples; False when there was no time for the
    whole round (it is not counted). Where not even the first round of every contender fits,
    the search's best two get the time, so that the winner never rests on one probe of each
    while the budget held back for the round goes unused. Decides ``verdict``: ``rounds``
    counts the rounds of every racing contender, ``tie_rounds`` those of two."""
    order = [c.trial for c in verdict.contenders]  # every round in the same order
    no_room = False
    while verdict.rounds < ROUNDS or (verdict.tie and _extra(verdict) < TIE_ROUNDS):
        still = set(verdict.racing())
        racing = [trial for trial in order if trial in still]
        verdict.left_race = [trial for trial in order if trial not in still]
        if len(racing) < 2:
            break  # the winner stands apart
        if not one_round(racing):
            no_room = True  # no time for the whole round
            break
        verdict.rounds += 1
        verdict.decide()
    verdict.decide()
    if not no_room:
        return
    if verdict.rounds == 0 and len(order) > 2:
        while verdict.tie_rounds < TIE_ROUNDS and one_round(order[:2]):
            verdict.tie_rounds += 1
            verdict.decide()
            if not verdict.closest():
                break  # the two stand apart
        return
    while verdict.tie and _extra(verdict) < TIE_ROUNDS:
        if not one_round(verdict.closest()):
            break
        verdict.tie_rounds += 1
        verdict.decide()


def _extra(verdict: Confirmation) -> int:
    """Rounds run after the first :data:`ROUNDS`."""
    return max(verdict.rounds - ROUNDS, 0) + verdict.tie_rounds
