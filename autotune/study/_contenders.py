"""Which candidates enter the confirmation round: the search's fastest
:data:`TOP_CONTENDERS`, and every one whose 95% interval reaches the best's, up to
:data:`MAX_CONTENDERS` (:mod:`autotune.study.confirmation`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from autotune.study._probe_statistics import step_interval
from autotune.training_goal import TrainingGoal

if TYPE_CHECKING:
    from autotune.study.records import TrialView

TOP_CONTENDERS = 3  # the search's fastest this many always contend
MAX_CONTENDERS = 5


def pick_contenders(estimates: list[tuple[float, float]]) -> list[int]:
    """Indexes of the contenders among ``estimates`` ((samples/s, 95% half-width), fastest
    first): the top :data:`TOP_CONTENDERS` plus any whose interval reaches the best's, at most
    :data:`MAX_CONTENDERS`."""
    if not estimates:
        return []
    best_rate, best_half = estimates[0]
    chosen = []
    for index, (rate, half) in enumerate(estimates):
        if index < TOP_CONTENDERS or rate + half >= best_rate - best_half:
            chosen.append(index)
        if len(chosen) >= MAX_CONTENDERS:
            break
    return chosen


def contenders(ranked: list[TrialView], goal: TrainingGoal | None = None) -> list[TrialView]:
    """The contenders among feasible trials ranked best first by ``goal``
    (:func:`pick_contenders`, on each trial's interval in the goal's units; a trial of a
    lower tier than the best, one that misses the deadline the best meets, never joins by
    overlap)."""
    goal = goal or TrainingGoal()
    if not ranked:
        return []
    top_tier = goal.tier(float(ranked[0].value or 0.0))
    estimates = []
    for trial in ranked:
        rate, half = step_interval(trial)
        tier = goal.tier(float(trial.value or 0.0))
        factor = goal.factor(trial.candidate.data_parallel_size, tier)
        estimates.append((factor * rate, factor * half) if tier == top_tier else (-math.inf, 0.0))
    return [ranked[i] for i in pick_contenders(estimates)]
