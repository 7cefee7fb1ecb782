"""The confirmation round: pick the winner on repeated, interleaved measurements.

One short probe moves by several percent on a shared machine (benchmarks/RESULTS.md), so
the search's ranking of close candidates is partly luck. Before the export, the top
candidates (:data:`TOP_CONTENDERS`, plus every
candidate whose 95% interval overlaps the best's, up to :data:`MAX_CONTENDERS`) are probed
again in rounds, interleaved A B C A B C ..., so that drift of the machine hits all of them
alike. Each probe's samples/s is one sample; a contender's estimate is the lower of the
median and the mean of its samples (:meth:`Contender.summarize`: one lucky probe lifts it
little, a slow mode pulls it down as it slows a production run), with a 95% interval and
its spread between probes; the winner is the highest estimate unless a simpler contender
(:attr:`Candidate.moving_parts <autotune.candidate.Candidate.moving_parts>`) or a markedly
steadier one is within noise of it (:class:`Confirmation`). Under a cost or deadline
objective across world sizes, "highest" is the goal's score of the estimate
(:meth:`TrainingGoal.score <autotune.training_goal.TrainingGoal.score>`: samples/s per GPU
for cost), and intervals compare in the same units.

The round's time is reserved from the budget before the search starts
(:func:`autotune.run.budget.reserve_s`), so it is never skipped because the search used
everything. This module holds the verdict and its rules, and keeps it in the study; who
contends (:mod:`autotune.study._contenders`), the statistics of repeated probes
(:mod:`autotune.study._probe_statistics`) and the loop of rounds
(:mod:`autotune.study._round_loop`) are their own modules, their names offered here.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autotune.candidate import simpler_because
from autotune.study._contenders import MAX_CONTENDERS, TOP_CONTENDERS, contenders, pick_contenders
from autotune.study._probe_statistics import ESTIMATE_OF, estimate_of, f_quantile, step_interval
from autotune.study._round_loop import ROUNDS, TIE_ROUNDS, run_rounds
from autotune.training_goal import TrainingGoal

if TYPE_CHECKING:
    import optuna

__all__ = [
    "CONFIRMATION_ATTR",
    "ESTIMATE_OF",
    "MAX_CONTENDERS",
    "ROUNDS",
    "TIE_ROUNDS",
    "TOP_CONTENDERS",
    "Confirmation",
    "Contender",
    "contenders",
    "f_quantile",
    "load",
    "markedly_steadier",
    "pick_contenders",
    "run_rounds",
    "simpler_within_noise",
    "step_interval",
    "store",
]

CONFIRMATION_ATTR = "autotune_confirmation"
# Within noise of the leader, a contender whose spread between probes is markedly smaller
# (the leader's variance over its own above the F distribution's 95% quantile: sample spreads
# of a few probes differ by chance) is the steadier one, and wins; under MIN_SPREAD every
# contender is steady enough.
MIN_SPREAD = 0.05
# ... unless the leader's mean over all its probes, its slow ones included, is ahead by more
# than this: then it is faster on the whole, however wide its spread (a production run pays
# the mean), and the steadier one would give up more than a steady spread's worth.
MAX_MEAN_LOSS = 0.05
# a 95% interval of fewer probes is too wide, or of two equal ones too narrow, to race on
MIN_PROBES_TO_RACE = 3
MIN_PROBES_FOR_SPREAD = 4  # fewer probes say too little about a spread to rank by it
# Within noise of the leader, a simpler contender wins if its estimate gives up at most this
# share of the leader's: a production user takes fewer moving parts over a difference the
# machine's noise cannot resolve, but not over one that a pick's quality would show (the
# benchmarks judge a pick at 0.97 of the best: benchmarks/search_efficiency/search_efficiency.py).
SIMPLER_MAX_LOSS = 0.02


class Contender(BaseModel):
    """One candidate in the round: every probe of it, and what they say together."""

    model_config = ConfigDict(extra="forbid")

    trial: int = Field(description="The search trial of this candidate.")
    label: str
    gpus: int = Field(default=1, description="Its world size (data-parallel ranks).")
    samples_per_s: list[float] = Field(description="One value per probe: search + confirmation.")
    step_spreads: list[float] = Field(
        default_factory=list,
        description="Each re-probe's own spread over its timed steps, (max - min) / median.",
    )
    failed_probes: int = Field(
        default=0,
        description="Re-probes of it that failed (out of memory, an error, a timeout): it "
        "leaves the race and wins only where every contender has failed.",
    )
    moving_parts: list[int | float] = Field(
        default_factory=list,
        description="Its place in the simplicity order (Candidate.moving_parts; lower is "
        "simpler); empty in rounds stored before the order, which never rank by it.",
    )
    estimate: float = Field(
        default=0.0, description="The lower of the probes' median and mean samples/s."
    )
    half_width: float = Field(
        default=0.0, description="95% interval of the estimate (as of a median), samples/s."
    )
    spread: float = Field(
        default=0.0, description="Spread between probes: standard deviation / estimate."
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        """Verdicts stored by the mean-based rule carry ``mean``; decide() recomputes."""
        if isinstance(data, dict) and "mean" in data:
            data = {k: v for k, v in data.items() if k != "mean"}
        return data

    def summarize(self) -> None:
        """The estimate, its 95% interval and the spread between probes. The estimate is the
        lower of the median and the mean: a lucky probe cannot lift a contender above its
        other probes (the median), and a slow mode that some of its probes land in (CPU
        offload measures bimodal here) pulls it down, as it slows a production run, which
        pays the mean."""
        self.estimate, self.half_width, self.spread = estimate_of(self.samples_per_s)

    def band(self, goal: TrainingGoal) -> tuple[int, float, float]:
        """The goal's tier of the estimate and its 95% interval in the goal's units."""
        tier = goal.tier(self.estimate)
        factor = goal.factor(self.gpus, tier)
        return (
            tier,
            factor * (self.estimate - self.half_width),
            factor * (self.estimate + self.half_width),
        )

    def overlaps(self, other: Contender, goal: TrainingGoal | None = None) -> bool:
        """The two 95% intervals overlap in the goal's units (samples/s without one): within
        noise of each other. Contenders in different tiers (one finishes by the deadline,
        the other not) never do."""
        goal = goal or TrainingGoal()
        tier, low, high = self.band(goal)
        other_tier, other_low, other_high = other.band(goal)
        return tier == other_tier and low <= other_high and other_low <= high

    def describe(self, goal: TrainingGoal | None = None) -> str:
        """Its estimate and how its probes ranged; per GPU too where ``goal`` ranks by it."""
        count = len(self.samples_per_s)
        failed = f"; {self.failed_probes} re-probe(s) failed" if self.failed_probes else ""
        factor = (goal or TrainingGoal()).factor(
            self.gpus, (goal or TrainingGoal()).tier(self.estimate)
        )
        per_gpu = f", {self.estimate * factor:.1f} per GPU" if factor != 1.0 else ""
        if count < 2:
            return f"{self.label}: {self.estimate:.1f} samples/s{per_gpu} (1 probe{failed})"
        return (
            f"{self.label}: {self.estimate:.1f} samples/s ±{self.half_width:.1f}{per_gpu} "
            f"(lower of median and mean of {count} probes, 95% interval; they ranged "
            f"{min(self.samples_per_s):.1f}..{max(self.samples_per_s):.1f}, spread "
            f"±{100 * self.spread:.0f}%{failed})"
        )


class Confirmation(BaseModel):
    """The round's outcome, stored as a study user attr and read by the decision of the
    best (:mod:`autotune.study.best`).

    The winner has the highest estimate, unless a contender within noise of it is simpler
    (:func:`simpler_within_noise`: fewer moving parts fail in fewer ways, and an offload
    that ties on one machine is usually slower on another) or markedly steadier
    (:func:`markedly_steadier`): a config taken to production for weeks should be fast
    every time, not the one whose probes were sometimes lucky (CPU offload, for one,
    measures bimodal here)."""

    model_config = ConfigDict(extra="forbid")

    contenders: list[Contender]
    rounds: int = Field(default=0, description="Rounds of every contender still in the race.")
    tie_rounds: int = Field(
        default=0,
        description="Rounds of the two closest, where a whole round no longer fit (in "
        "rounds stored before the round's plan grew to 20, every extra round of two).",
    )
    seconds: float = 0.0
    winner: int | None = Field(default=None, description="Trial number of the winner.")
    after_trial: int = Field(default=-1, description="Last trial number when it was decided.")
    left_race: list[int] = Field(
        default_factory=list,
        description="Trials that left the rounds early, out of the winner's noise.",
    )
    steadier_over: int | None = Field(
        default=None,
        description="The trial with the higher estimate that the steadier winner was chosen over.",
    )
    simpler_over: int | None = Field(
        default=None,
        description="The trial with the higher estimate that the simpler winner was chosen over.",
    )
    goal: TrainingGoal | None = Field(
        default=None, description="The goal the round ranked by; None: throughput."
    )

    @property
    def ranking(self) -> TrainingGoal:
        """The goal the round ranks by (throughput for a round stored without one)."""
        return self.goal or TrainingGoal()

    def decide(self) -> None:
        """Rank the contenders: the highest estimate (in the goal's units) leads; the simplest
        contender within its noise (:func:`simpler_within_noise`) wins over it, else a
        markedly steadier one (:func:`markedly_steadier`)."""
        for contender in self.contenders:
            contender.summarize()
        goal = self.ranking
        ranked = sorted(
            self.contenders,
            key=lambda c: (c.failed_probes == 0, goal.score(c.estimate, c.gpus)),
            reverse=True,
        )
        self.steadier_over = self.simpler_over = None
        if ranked:
            leader = ranked[0]
            sound = [c for c in ranked[1:] if not c.failed_probes]
            simpler = [c for c in sound if simpler_within_noise(c, leader, goal)]
            steadier = [c for c in sound if markedly_steadier(c, leader, goal)]
            if simpler:
                chosen = min(simpler, key=lambda c: c.moving_parts)  # ties: the higher estimate
                self.simpler_over = leader.trial
            elif steadier:
                chosen = steadier[0]
                self.steadier_over = leader.trial
            if simpler or steadier:
                ranked.remove(chosen)
                ranked.insert(0, chosen)
        self.contenders = ranked
        self.winner = ranked[0].trial if ranked else None

    def racing(self) -> list[int]:
        """The contenders worth another round, in their order: all before the first
        decision; then the winner and every contender none of whose re-probes failed, of
        those until the winner has the probes to race (:data:`MIN_PROBES_TO_RACE`), then
        of those whose 95% interval still reaches its own (racing, as in Maron and Moore,
        "Hoeffding races", NIPS 1993: a contender out of the winner's noise cannot win,
        not even as the steadier one)."""
        if self.winner is None:
            return [c.trial for c in self.contenders]
        winner = next(c for c in self.contenders if c.trial == self.winner)
        ready = len(winner.samples_per_s) >= MIN_PROBES_TO_RACE
        return [
            c.trial
            for c in self.contenders
            if c is winner
            or (
                not c.failed_probes
                and (
                    not ready
                    or len(c.samples_per_s) < MIN_PROBES_TO_RACE
                    or c.overlaps(winner, self.ranking)
                )
            )
        ]

    @property
    def tie(self) -> bool:
        """The winner overlaps another contender: not ranked apart yet."""
        return self.rounds > 0 and bool(self.closest())

    def closest(self) -> list[int]:
        """The pair whose extra rounds decide the pick, while the winner overlaps another
        contender: the winner and the leader it was chosen over (as the simpler or the
        steadier); else the winner and the simplest contender within its noise that is
        simpler than it (more rounds may show it within :data:`SIMPLER_MAX_LOSS`); else the
        winner and the one within its noise whose spread is widest (the one least ranked).
        Empty when the winner stands apart."""
        if len(self.contenders) < 2:
            return []
        winner = self.contenders[0]
        near = [
            c
            for c in self.contenders[1:]
            if not c.failed_probes and c.overlaps(winner, self.ranking)
        ]
        if not near:
            return []
        over = self.simpler_over if self.simpler_over is not None else self.steadier_over
        if over is not None and any(c.trial == over for c in near):
            return [winner.trial, over]
        simpler = [c for c in near if c.moving_parts and c.moving_parts < winner.moving_parts]
        if simpler:
            return [winner.trial, min(simpler, key=lambda c: c.moving_parts).trial]
        return [winner.trial, max(near, key=lambda c: c.spread).trial]

    def describe(self) -> str:
        if not self.contenders:
            return "no confirmation round"
        goal = self.goal
        lines = [f"winner {self.contenders[0].describe(goal)}"]
        lines += [f"runner-up {c.describe(goal)}" for c in self.contenders[1:]]
        if goal is not None:
            lines.insert(0, f"ranked by {goal.objective}")
        if self.left_race:
            lines.append(
                f"trial(s) {', '.join(map(str, self.left_race))} left the rounds early, out of "
                "the winner's noise"
            )
        if self.tie_rounds:
            lines.append(f"{self.tie_rounds} more round(s) of the two closest to rank them")
        if self.simpler_over is not None:
            lines.append(
                f"within noise of trial {self.simpler_over}'s higher estimate and "
                f"simpler ({self.simpler_reason()}): chose the simpler"
            )
        elif self.steadier_over is not None:
            lines.append(
                f"within noise of trial {self.steadier_over}'s higher estimate and markedly "
                "steadier: chose the steadier"
            )
        elif self.tie:
            lines.append("the best two overlap within noise: the higher estimate was taken")
        return "; ".join(lines)

    def simpler_reason(self) -> str:
        """What makes the winner simpler than the leader it was chosen over ("" if not)."""
        over = [c for c in self.contenders if c.trial == self.simpler_over]
        if not over or not self.contenders:
            return ""
        return simpler_because(tuple(self.contenders[0].moving_parts), tuple(over[0].moving_parts))


def simpler_within_noise(
    contender: Contender, leader: Contender, goal: TrainingGoal | None = None
) -> bool:
    """``contender`` is simpler than ``leader`` (both with a place in the simplicity order),
    both have the probes to race (:data:`MIN_PROBES_TO_RACE`), their 95% intervals overlap
    in ``goal``'s units, and its estimate gives up at most :data:`SIMPLER_MAX_LOSS` of the
    leader's."""
    goal = goal or TrainingGoal()
    if not contender.moving_parts or not leader.moving_parts:
        return False
    if contender.moving_parts >= leader.moving_parts:
        return False
    if min(len(contender.samples_per_s), len(leader.samples_per_s)) < MIN_PROBES_TO_RACE:
        return False
    if not contender.overlaps(leader, goal):
        return False
    tier = goal.tier(leader.estimate)  # the contender's too: they overlap
    leader_score = leader.estimate * goal.factor(leader.gpus, tier)
    return contender.estimate * goal.factor(contender.gpus, tier) >= leader_score * (
        1.0 - SIMPLER_MAX_LOSS
    )


def markedly_steadier(
    contender: Contender, leader: Contender, goal: TrainingGoal | None = None
) -> bool:
    """``contender`` is within ``leader``'s noise, gives up at most :data:`MAX_MEAN_LOSS` of
    the leader's mean (both in ``goal``'s units), and its spread between probes is smaller
    beyond chance (an F test of the two variances), the leader's being wide at all."""
    goal = goal or TrainingGoal()
    n_c, n_l = len(contender.samples_per_s), len(leader.samples_per_s)
    if min(n_c, n_l) < MIN_PROBES_FOR_SPREAD or leader.spread <= MIN_SPREAD:
        return False
    if not contender.overlaps(leader, goal):
        return False
    tier = goal.tier(leader.estimate)  # the contender's too: they overlap
    leader_mean = statistics.fmean(leader.samples_per_s) * goal.factor(leader.gpus, tier)
    contender_mean = statistics.fmean(contender.samples_per_s) * goal.factor(contender.gpus, tier)
    if contender_mean < leader_mean * (1.0 - MAX_MEAN_LOSS):
        return False
    if contender.spread <= 0:
        return True
    ratio = (leader.spread / contender.spread) ** 2
    return ratio > f_quantile(n_l - 1, n_c - 1)


def load(study: optuna.Study) -> Confirmation | None:
    raw: Any = study.user_attrs.get(CONFIRMATION_ATTR)
    return Confirmation.model_validate(raw) if raw else None


def store(study: optuna.Study, verdict: Confirmation) -> None:
    study.set_user_attr(CONFIRMATION_ATTR, verdict.model_dump(mode="json"))
