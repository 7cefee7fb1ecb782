"""The one decision of "the best" trial.

Every output that names a best trial asks :func:`decide_best`: the run's export, ``autotune
export``, the ``*`` of ``autotune status``, ``summary.md`` and the study user attr
:data:`BEST_ATTR`, which optuna-dashboard shows among the study's user attributes. The
confirmation round's winner when there is one, else the fastest feasible trial.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from autotune.records import TrialView, ranked_feasible

if TYPE_CHECKING:
    import optuna

    from autotune.confirm import Confirmation

BEST_ATTR = "autotune_best"


class Best(BaseModel):
    """The one trial every output calls the best, and why."""

    model_config = ConfigDict(extra="forbid")

    trial: int = Field(description="Trial number.")
    label: str
    samples_per_s: float = Field(description="The estimate the decision rests on.")
    half_width: float = Field(default=0.0, description="95% interval of that estimate.")
    probes: int = Field(default=1, description="Probes behind the estimate.")
    confirmed: bool = Field(description="Decided by the confirmation round.")
    reason: str = Field(description="One line: why this trial.")


def decide_best(trials: list[TrialView], verdict: Confirmation | None) -> Best | None:
    """The confirmation round's winner when there is one; else the fastest feasible trial.

    A trial measured after the round was decided that beats the winner's confirmed estimate
    outright (above its 95% interval) takes its place: a continued study's search found
    something faster, and the next round will confirm it."""
    ranked = ranked_feasible(trials)
    if not ranked:
        return None
    fastest = ranked[0]
    raw = Best(
        trial=fastest.number,
        label=fastest.label,
        samples_per_s=float(fastest.value or 0.0),
        confirmed=False,
        reason=f"fastest of {len(ranked)} feasible configuration(s) measured",
    )
    if verdict is None or verdict.winner is None or not verdict.contenders:
        return raw
    by_number = {t.number: t for t in ranked}
    winner = by_number.get(verdict.winner)
    leader = verdict.contenders[0]
    newer = [t for t in ranked if t.number > verdict.after_trial]
    if winner is None or (newer and (newer[0].value or 0.0) > leader.estimate + leader.half_width):
        return raw.model_copy(
            update={"reason": raw.reason + ", measured after the confirmation round"}
        )
    return Best(
        trial=winner.number,
        label=winner.label,
        samples_per_s=leader.estimate,
        half_width=leader.half_width,
        probes=len(leader.samples_per_s),
        confirmed=True,
        reason=f"confirmed over {len(leader.samples_per_s)} interleaved probes of "
        f"{len(verdict.contenders)} contenders"
        + (
            ", the steadier within noise of the fastest"
            if verdict.steadier_over is not None
            else ""
        ),
    )


def store(study: optuna.Study, decided: Best | None) -> None:
    """Keep the decision in the study, where optuna-dashboard shows it."""
    study.set_user_attr(BEST_ATTR, None if decided is None else decided.model_dump())


def of_study(study: optuna.Study) -> Best | None:
    """The best of ``study`` by :func:`decide_best` (computed, never read back stale)."""
    from autotune import confirm
    from autotune.records import views

    return decide_best(views(study), confirm.load(study))
