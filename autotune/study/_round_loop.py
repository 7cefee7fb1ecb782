"""The confirmation round's loop: which contenders each round probes, and when it ends
(:func:`run_rounds`; the rounds on real probes are :mod:`autotune.run`'s, the verdict
:class:`~autotune.study.confirmation.Confirmation`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from autotune.study.confirmation import Confirmation

ROUNDS = 3
TIE_ROUNDS = 3  # rounds of the two closest alone while they overlap, reserved
MAX_TIE_ROUNDS = 6  # ... and more while the budget has room for them


def run_rounds(verdict: Confirmation, one_round: Callable[[list[int]], bool]) -> None:
    """Drive the round: :data:`ROUNDS` interleaved rounds of every contender still in the
    race (:meth:`Confirmation.racing`: a contender out of the winner's noise gets no more
    probes, its time goes to the close calls), then, while
    the winner overlaps another, up to :data:`MAX_TIE_ROUNDS` rounds of the winner and the
    widest-spread contender within its noise (a contender too scattered to rank gets more
    probes before any other). ``one_round(trials)`` probes those contenders once each and
    appends to their samples; False when there was no time for the whole round (it is not
    counted). When a round of every contender no longer fits, the rounds of the two
    closest still may: the closest call gets the time that is left; where not even the
    first round of every contender fits, the search's best two get it, so that the winner
    never rests on one probe of each while the budget held back for the round goes unused.
    Decides ``verdict``."""
    order = [c.trial for c in verdict.contenders]  # every round in the same order
    no_room = False
    for _ in range(ROUNDS):
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
    if no_room and verdict.rounds == 0 and len(order) > 2:
        while verdict.tie_rounds < MAX_TIE_ROUNDS and one_round(order[:2]):
            verdict.tie_rounds += 1
            verdict.decide()
            if not verdict.closest():
                break  # the two stand apart
        return
    while verdict.tie and verdict.tie_rounds < MAX_TIE_ROUNDS:
        if not one_round(verdict.closest()):
            break
        verdict.tie_rounds += 1
        verdict.decide()
