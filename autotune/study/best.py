"""The one decision of "the best" trial.

Every output that names a best trial asks :func:`decide_best`: the run's export, ``autotune
export``, the ``*`` of ``autotune status``, ``summary.md`` and the study user attr
:data:`BEST_ATTR`, which optuna-dashboard shows among the study's user attributes. The
confirmation round's winner when there is one, else the best feasible trial by the study's
goal (:mod:`autotune.training_goal`: the fastest under the default throughput objective).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from autotune.study.confirmation import ESTIMATE_OF
from autotune.study.records import TrialView, ranked_feasible
from autotune.training_goal import TrainingGoal

if TYPE_CHECKING:
    import optuna

    from autotune.study.confirmation import Confirmation, Contender

BEST_ATTR = "autotune_best"


class Best(BaseModel):
    """The one trial every output calls the best, and why."""

    model_config = ConfigDict(extra="forbid")

    trial: int = Field(description="Trial number.")
    label: str
    gpus: int = Field(default=1, description="Its world size (data-parallel ranks).")
    samples_per_s: float = Field(description="The estimate the decision rests on.")
    half_width: float = Field(default=0.0, description="95% interval of that estimate.")
    probes: int = Field(default=1, description="Probes behind the estimate.")
    confirmed: bool = Field(description="Decided by the confirmation round.")
    reason: str = Field(description="One line: why this trial.")


def decide_best(
    trials: list[TrialView],
    verdict: Confirmation | None,
    set_aside: Collection[int] = (),
    goal: TrainingGoal | None = None,
) -> Best | None:
    """The confirmation round's winner when there is one; else the best feasible trial by
    ``goal`` (the fastest without one). A round that ranked by another goal (the study was
    continued under another objective) does not decide: the search's ranking does.

    A trial measured after the round was decided that beats the winner's confirmed estimate
    outright (above its 95% interval) takes its place: a continued study's search found
    something faster, and the next round will confirm it. A single probe the round ranked
    below the winner never does, however fast it once measured. A winner that is not feasible
    now leaves its place to the next contender in the round's order that is. A trial
    ``set_aside`` (``run --verify strict``: its loss check differs,
    :func:`autotune.study.loss_checks.set_aside`) is never the best."""
    aside = frozenset(set_aside)
    goal = goal or TrainingGoal()
    every = ranked_feasible(trials, goal)
    ranked = [t for t in every if t.number not in aside]
    if not ranked:
        return None
    if verdict is not None and not verdict.ranking.ranks_like(goal):
        decided = _unconfirmed(
            ranked[0],
            f"{goal.noun(float(ranked[0].value or 0.0))} of {len(ranked)} feasible "
            "configuration(s) measured; the "
            f"confirmation round ranked by {verdict.ranking.objective}",
        )
    else:
        decided = _decided(ranked, verdict, aside, goal)
    passed = [n for n in sorted(aside) if n in {t.number for t in every}]
    if passed:
        numbers = ", ".join(str(n) for n in passed)
        decided.reason += f"; set aside by the loss check (it differs): trial(s) {numbers}"
    return decided


def _decided(
    ranked: list[TrialView],
    verdict: Confirmation | None,
    aside: frozenset[int],
    goal: TrainingGoal,
) -> Best:
    """:func:`decide_best` over the trials left (``ranked``, none set aside)."""
    noun = goal.noun(float(ranked[0].value or 0.0))
    fastest = f"{noun} of {len(ranked)} feasible configuration(s) measured"
    if verdict is None or verdict.winner is None or not verdict.contenders:
        return _unconfirmed(ranked[0], fastest)
    by_number = {t.number: t for t in ranked}
    standing = [c for c in verdict.contenders if c.trial in by_number]
    if not standing:
        return _unconfirmed(
            ranked[0], fastest + "; no contender of the confirmation round is feasible any more"
        )
    leader = standing[0]
    newer = [t for t in ranked if t.number > verdict.after_trial]
    if newer and _beats(newer[0], leader, goal):
        return _unconfirmed(
            newer[0],
            f"measured after the confirmation round, above the {leader.estimate:.1f} "
            f"samples/s ±{leader.half_width:.1f} of its winner (trial {leader.trial})",
        )
    reprobes = len(leader.samples_per_s) - 1  # the first is its search probe
    reason = (
        f"confirmed on {ESTIMATE_OF} its search probe and "
        f"{reprobes} interleaved re-probe(s), among {len(verdict.contenders)} contenders"
    )
    if leader.trial != verdict.winner and verdict.winner in aside:
        reason += f"; the round's winner, trial {verdict.winner}, trains differently"
    elif leader.trial != verdict.winner:
        reason += f"; the round's winner, trial {verdict.winner}, is not feasible now"
    elif verdict.simpler_over is not None:
        reason += f", the simpler within noise of the fastest ({verdict.simpler_reason()})"
    elif verdict.steadier_over is not None:
        reason += ", the steadier within noise of the fastest"
    return Best(
        trial=leader.trial,
        label=by_number[leader.trial].label,
        gpus=by_number[leader.trial].candidate.data_parallel_size,
        samples_per_s=leader.estimate,
        half_width=leader.half_width,
        probes=len(leader.samples_per_s),
        confirmed=True,
        reason=reason,
    )


def _beats(trial: TrialView, leader: Contender, goal: TrainingGoal) -> bool:
    """``trial``'s one measurement ranks above the top of ``leader``'s 95% interval, in the
    goal's units (a higher tier always does)."""
    tier, value = goal.score(float(trial.value or 0.0), trial.candidate.data_parallel_size)
    leader_tier, _, leader_high = leader.band(goal)
    return tier > leader_tier or (tier == leader_tier and value > leader_high)


def _unconfirmed(trial: TrialView, reason: str) -> Best:
    """``trial`` as the best on its single probe's measurement."""
    return Best(
        trial=trial.number,
        label=trial.label,
        gpus=trial.candidate.data_parallel_size,
        samples_per_s=float(trial.value or 0.0),
        confirmed=False,
        reason=reason,
    )


def store(study: optuna.Study, decided: Best | None) -> None:
    """Keep the decision in the study, where optuna-dashboard shows it."""
    study.set_user_attr(BEST_ATTR, None if decided is None else decided.model_dump())


def of_study(study: optuna.Study) -> Best | None:
    """The best of ``study`` by :func:`decide_best` (computed, never read back stale)."""
    from autotune import training_goal
    from autotune.study import confirmation as confirm
    from autotune.study import loss_checks
    from autotune.study.records import views

    return decide_best(
        views(study),
        confirm.load(study),
        loss_checks.set_aside(study),
        training_goal.of_study(study),
    )
