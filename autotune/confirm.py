"""The confirmation round: pick the winner on repeated, interleaved measurements.

One short probe moves by about ±10% on a shared machine, so the search's ranking of close
candidates is partly luck. Before the export, the top candidates (:data:`TOP`, plus every
candidate whose 95% interval overlaps the best's, up to :data:`MAX_CONTENDERS`) are probed
again in rounds, interleaved A B C A B C ..., so that drift of the machine hits all of them
alike. Each probe's samples/s is one sample; the winner is the highest mean, and the
summary states each contender's mean with its 95% interval (Student's t over the samples:
the search's probe plus every confirmation probe).

The round's time is reserved from the budget before the search starts
(:func:`reserve_s`), so it is never skipped because the search used everything.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from autotune.steps import mean_interval

if TYPE_CHECKING:
    import optuna

    from autotune.records import TrialView

TOP = 3
MAX_CONTENDERS = 5
ROUNDS = 3
TIE_ROUNDS = 3  # rounds of the best two alone while their intervals overlap, reserved
MAX_TIE_ROUNDS = 6  # ... and more while the budget has room for them
MAX_RESERVE_SHARE = 0.4  # the search keeps at least the rest of the budget
CONFIRMATION_ATTR = "autotune_confirmation"


class Contender(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trial: int = Field(description="The search trial of this candidate.")
    label: str
    samples_per_s: list[float] = Field(description="One value per probe: search + confirmation.")
    mean: float = 0.0
    half_width: float = Field(default=0.0, description="95% interval of the mean, samples/s.")

    def summarize(self) -> None:
        self.mean = statistics.fmean(self.samples_per_s) if self.samples_per_s else 0.0
        _, half = mean_interval(self.samples_per_s) if len(self.samples_per_s) > 1 else (0, 0)
        self.half_width = 0.0 if math.isinf(half) else half

    def describe(self) -> str:
        interval = f" ±{self.half_width:.1f}" if len(self.samples_per_s) > 1 else ""
        return (
            f"{self.label}: {self.mean:.1f} samples/s{interval} "
            f"(95% interval, {len(self.samples_per_s)} probes)"
        )


class Confirmation(BaseModel):
    """The round's outcome, stored as a study user attr and read by the export."""

    model_config = ConfigDict(extra="forbid")

    contenders: list[Contender]
    rounds: int = 0
    tie_rounds: int = Field(default=0, description="Extra rounds of the best two (a tie).")
    seconds: float = 0.0
    winner: int | None = Field(default=None, description="Trial number of the winner.")
    after_trial: int = Field(default=-1, description="Last trial number when it was decided.")

    def decide(self) -> None:
        for contender in self.contenders:
            contender.summarize()
        ranked = sorted(self.contenders, key=lambda c: c.mean, reverse=True)
        self.contenders = ranked
        self.winner = ranked[0].trial if ranked else None

    @property
    def tie(self) -> bool:
        """The winner's and the runner-up's intervals overlap: statistically a tie."""
        if len(self.contenders) < 2 or self.rounds == 0:
            return False
        first, second = self.contenders[0], self.contenders[1]
        return first.mean - first.half_width <= second.mean + second.half_width

    def describe(self) -> str:
        if not self.contenders:
            return "no confirmation round"
        lines = [f"winner {self.contenders[0].describe()}"]
        lines += [f"runner-up {c.describe()}" for c in self.contenders[1:]]
        if self.tie_rounds:
            lines.append(f"{self.tie_rounds} more round(s) of the best two to break a tie")
        if self.tie:
            lines.append("the best two overlap within noise: the higher mean was taken")
        return "; ".join(lines)


def run_rounds(verdict: Confirmation, one_round: Callable[[list[int]], bool]) -> None:
    """Drive the round: :data:`ROUNDS` interleaved rounds of every contender, then, while the
    best two still overlap, up to :data:`MAX_TIE_ROUNDS` rounds of just those two (each
    halves a round's cost and narrows both intervals). ``one_round(trials)`` probes those
    contenders once each and appends to their samples; False when there was no time for the
    whole round (it is not counted). When a round of every contender no longer fits, the
    rounds of the best two still may: the closest call gets the time that is left. Decides
    ``verdict``."""
    for _ in range(ROUNDS):
        if not one_round([c.trial for c in verdict.contenders]):
            break
        verdict.rounds += 1
    verdict.decide()
    while verdict.tie and verdict.tie_rounds < MAX_TIE_ROUNDS:
        if not one_round([c.trial for c in verdict.contenders[:2]]):
            break
        verdict.tie_rounds += 1
        verdict.decide()


def step_interval(trial: TrialView) -> tuple[float, float]:
    """A search trial's samples/s and the half-width of its 95% interval, from its steps."""
    record = trial.record
    times = record.step_times_s
    rate = record.samples_per_s
    if len(times) < 2 or rate <= 0:
        return rate, rate * 0.1  # one step: assume the ±10% noise of this machine class
    mean, half = mean_interval(times)
    batch = rate * statistics.median(times)
    return batch / mean, batch / max(mean - half, 1e-9) - batch / mean


def pick_contenders(estimates: list[tuple[float, float]]) -> list[int]:
    """Indexes of the contenders among ``estimates`` ((samples/s, 95% half-width), fastest
    first): the top :data:`TOP` plus any whose interval reaches the best's, at most
    :data:`MAX_CONTENDERS`."""
    if not estimates:
        return []
    best_rate, best_half = estimates[0]
    chosen = []
    for index, (rate, half) in enumerate(estimates):
        if index < TOP or rate + half >= best_rate - best_half:
            chosen.append(index)
        if len(chosen) >= MAX_CONTENDERS:
            break
    return chosen


def contenders(ranked: list[TrialView]) -> list[TrialView]:
    """The contenders among feasible trials ranked fastest first (:func:`pick_contenders`)."""
    return [ranked[i] for i in pick_contenders([step_interval(t) for t in ranked])]


def planned_probes(contenders: int) -> int:
    """Probes the round is planned for: :data:`ROUNDS` of every contender and
    :data:`TIE_ROUNDS` of the best two."""
    return ROUNDS * min(max(contenders, 2), MAX_CONTENDERS) + 2 * TIE_ROUNDS


def reserve_s(confirm_probe_s: float, contenders: int, budget_s: float) -> float:
    """Budget held back from the search for the round: :func:`planned_probes` at the wall
    time of one full-length probe (confirmation probes never stop early), at most
    :data:`MAX_RESERVE_SHARE` of the budget (the search must still have room to find
    something worth confirming). ``contenders`` is how many the search leaves so far
    (:func:`contenders`), at least :data:`TOP` (more may join)."""
    wanted = planned_probes(max(contenders, TOP)) * max(confirm_probe_s, 1.0)
    return min(wanted, MAX_RESERVE_SHARE * max(budget_s, 0.0))


def load(study: optuna.Study) -> Confirmation | None:
    raw: Any = study.user_attrs.get(CONFIRMATION_ATTR)
    return Confirmation.model_validate(raw) if raw else None


def store(study: optuna.Study, verdict: Confirmation) -> None:
    study.set_user_attr(CONFIRMATION_ATTR, verdict.model_dump(mode="json"))
