"""The study's time: its budget across runs, what the next probe will take, and the time
held back for the confirmation round.

Plain objects over plain numbers, so that
``benchmarks/search_efficiency/search_efficiency.py`` replays the tuner's own rules
(counting probes instead of seconds) instead of a copy of them.

- :class:`BudgetClock`: the budget is the study's (``total_s``, ``spent_s`` in the study
  user attr :data:`BUDGET_ATTR`); a run gets what is left, or a new total, and its probing
  ends early enough for the run's finish (closing workers, deciding, exporting) to fit.
- :func:`probe_estimate_s`: the median wall time of the study's probes; a probe that paid
  its process group's start (a cold launch, or a warm worker's first probe) is left out
  once a warm one exists, or one cold start makes the next probe look too long to fit.
- :class:`ReservePolicy`: when the round's time is held back, and how much; and the loss
  check's (``run --verify``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from autotune.settings import DEFAULT_BUDGET_S
from autotune.study import confirmation as confirm

if TYPE_CHECKING:
    import optuna

    from autotune.study import TrialView

BUDGET_ATTR = "autotune_budget"
# What a run takes after its last probe (closing the warm workers and Ray, deciding the best,
# writing the export): how far past the budget's end runs ended when nothing was held back
# for it is in benchmarks/RESULTS.md, "autotune against DeepSpeed's own autotuner".
# Held back until a run of the study has measured its own finish.
DEFAULT_FINISH_S = 5.0


class BudgetRecord(BaseModel):
    """The study user attr :data:`BUDGET_ATTR`."""

    model_config = ConfigDict(extra="forbid")

    total_s: float = Field(default=DEFAULT_BUDGET_S, description="The study's whole budget.")
    spent_s: float = Field(default=0.0, description="Wall time its runs have used so far.")
    finish_s: float | None = Field(
        default=None,
        description="Wall time the last run took after its last probe (closing workers, "
        "deciding, exporting): held back from the next run's probing. None: not measured yet.",
    )


def read_budget(study: optuna.Study) -> BudgetRecord:
    return BudgetRecord.model_validate(study.user_attrs.get(BUDGET_ATTR) or {})


class BudgetClock:
    """One run's share of the study's budget. ``start`` when probing begins, from the
    moment the command started (``origin``): a run's own set-up (imports, the plan, Ray,
    the warm workers) is part of the wall time its user asked for; the one-time build of
    DeepSpeed's ops is left out by the caller, who moves the origin past it.

    So is the run's finish: probing stops ``finish_s`` before the budget's end
    (:attr:`probing_left_s`), the study's last measured finish or :data:`DEFAULT_FINISH_S`;
    :meth:`probing_done` and :meth:`finished` measure this run's.

    ``clock`` reads the time in seconds (``time.monotonic``; a test gives a clock it
    advances itself)."""

    def __init__(
        self,
        stored: BudgetRecord,
        given_total_s: float | None,
        *,
        shared: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shared = shared
        self._clock = clock
        if shared:
            # side by side with other drivers, each runs for its own --budget (else what the
            # study had left when it joined) and the study's counter is left alone
            left_s = stored.total_s - stored.spent_s
            self.total_s = given_total_s if given_total_s is not None else left_s
            self.spent_before_s = 0.0
        else:
            self.total_s = given_total_s if given_total_s is not None else stored.total_s
            self.spent_before_s = stored.spent_s
        self.stored_finish_s = stored.finish_s
        self.finish_s = DEFAULT_FINISH_S if stored.finish_s is None else stored.finish_s
        self._started: float | None = None
        self._probing_done: float | None = None
        self._measured_finish_s: float | None = None

    def start(self, origin: float | None = None) -> None:
        """Run the clock from ``origin`` (a reading of its ``clock``), else from now."""
        now = self._clock()
        self._started = now if origin is None else min(origin, now)

    @property
    def elapsed_s(self) -> float:
        return 0.0 if self._started is None else self._clock() - self._started

    @property
    def spent_s(self) -> float:
        return self.spent_before_s + self.elapsed_s

    @property
    def run_budget_s(self) -> float:
        """What this run may use: the total less what earlier runs spent."""
        return self.total_s - self.spent_before_s

    @property
    def left_s(self) -> float:
        return self.total_s - self.spent_s

    @property
    def probing_left_s(self) -> float:
        """What is left for probes: the budget less the time held back for the finish."""
        return self.left_s - self.finish_s

    def probing_done(self) -> None:
        """The run's last probe is over: its finish starts now."""
        self._probing_done = self._clock()

    def finished(self) -> None:
        """The run's finish is over: measure it for the study's next run."""
        if self._probing_done is not None:
            self._measured_finish_s = self._clock() - self._probing_done

    def record(self) -> BudgetRecord:
        measured = self._measured_finish_s
        return BudgetRecord(
            total_s=self.total_s,
            spent_s=round(self.spent_s, 1),
            finish_s=round(measured, 1) if measured is not None else self.stored_finish_s,
        )

    def store(self, study: optuna.Study) -> None:
        if not self.shared:
            study.set_user_attr(BUDGET_ATTR, self.record().model_dump())


def probe_estimate_s(trials: Iterable[TrialView], *, full_only: bool = False) -> float:
    """Median wall time of the study's probes (of those that ran in full if ``full_only``:
    confirmation probes never stop early, and an early-stopped probe is a fraction of one).
    0 when there is none yet."""
    walls: list[tuple[float, bool]] = []
    for trial in trials:
        record = trial.record
        if record.probe_wall_s is None or not trial.is_evaluation:
            continue
        if full_only and not trial.measured_in_full:
            continue
        walls.append((record.probe_wall_s, record.probe_cold_start))
    warm = [wall for wall, cold in walls if not cold]
    chosen = warm or [wall for wall, _ in walls]
    return statistics.median(chosen) if chosen else 0.0


MAX_RESERVE_SHARE = 0.4  # the round's reserve at most; the search keeps the rest


def planned_probes(contenders: int) -> int:
    """Probes the round is planned for (:mod:`autotune.study.confirmation`'s constants):
    ``ROUNDS`` of every contender (at most ``MAX_CONTENDERS``) and ``TIE_ROUNDS`` more while
    tied, counted as rounds of two (racing leaves the close calls)."""
    every = min(max(contenders, 2), confirm.MAX_CONTENDERS)
    return confirm.ROUNDS * every + 2 * confirm.TIE_ROUNDS


def reserve_s(confirm_probe_s: float, contenders: int, budget_s: float) -> float:
    """Budget held back from the search for the round: :func:`planned_probes` at the wall
    time of one full-length probe (confirmation probes never stop early), at most
    :data:`MAX_RESERVE_SHARE` of the budget (the search must still have room to find
    something worth confirming; on a budget short of the plan the search ends early
    instead once it has nothing promising left, :meth:`ReservePolicy.settled`).
    ``contenders`` is how many the search leaves so far
    (:func:`autotune.study.confirmation.contenders`), at least its ``TOP_CONTENDERS`` (more
    may join)."""
    return min(planned_s(confirm_probe_s, contenders), MAX_RESERVE_SHARE * max(budget_s, 0.0))


def planned_s(confirm_probe_s: float, contenders: int) -> float:
    """The round's whole plan in seconds (:func:`reserve_s` before its cap)."""
    return planned_probes(max(contenders, confirm.TOP_CONTENDERS)) * max(confirm_probe_s, 1.0)


def plan_fits(confirm_probe_s: float, contenders: int, budget_s: float) -> bool:
    """The round's whole plan (:func:`planned_s`) fits in :data:`MAX_RESERVE_SHARE` of the
    budget: the budget is not short of it."""
    return planned_s(confirm_probe_s, contenders) <= MAX_RESERVE_SHARE * max(budget_s, 0.0)


@dataclass(frozen=True)
class SearchState:
    """What the search knows when it weighs the confirmation round (:class:`ReservePolicy`)."""

    feasible: int  # feasible configurations found
    stages_covered: bool  # every ZeRO stage that may fit has had its probe
    contenders: int  # contenders the search leaves so far (confirmation.contenders)
    full_probe_s: float  # median wall time of a probe that ran in full (0: none yet)
    probe_s: float  # median wall time of any probe (0: none yet)
    budget_s: float  # the run's budget


@dataclass(frozen=True)
class ReservePolicy:
    """The budget held back from the search for the confirmation round.

    Nothing is held back before the search has two feasible configs (there is nothing to
    confirm, and a search stopped with one never reaches a round), nor, with autotune's
    sampler, before every ZeRO stage that may fit has had its probe (on a short budget the
    reserve otherwise ends the search after two configs and confirms the wrong ones). Then:
    :func:`reserve_s` for the contenders the search leaves so far, at
    the wall time of a full-length probe.

    On a budget short of the round's plan, the search ends as soon as it has nothing
    promising left to probe (:meth:`settled`): every probe left then goes to the round.
    """

    enabled: bool = True
    fallback_probe_s: float = 20.0
    verify_steps: int = 0  # optimizer steps of each run of the loss check; 0: no check
    verify_launches: int = 1  # launches of the check: one, or one per run for a script

    def reserve_s(self, state: SearchState) -> float:
        if not self._round_due(state):
            return 0.0
        return reserve_s(self._per_probe_s(state), state.contenders, state.budget_s)

    def settled(self, state: SearchState, *, promising: bool) -> bool:
        """The search should end now and leave the rest of the budget to the round: the
        round is due (as for :meth:`reserve_s`), no open candidate is ``promising``
        (:meth:`CandidatePolicy.promising <autotune.run.sampler.CandidatePolicy.promising>`),
        and the budget is short of the round's plan (its reserve is capped): a probe
        predicted to lose is worth less there than one more probe of each contender. On a
        budget that holds the plan the search goes on: the cost model is rough, and a
        long search may still find what it ranked low."""
        if promising or not self._round_due(state):
            return False
        return not plan_fits(self._per_probe_s(state), state.contenders, state.budget_s)

    def _round_due(self, state: SearchState) -> bool:
        return self.enabled and state.feasible >= 2 and state.stages_covered

    def _per_probe_s(self, state: SearchState) -> float:
        return state.full_probe_s or state.probe_s or self.fallback_probe_s

    def verify_reserve_s(
        self, *, feasible: int, launch_s: float, step_s: float, checked_s: float = 0.0
    ) -> float:
        """The loss check's time (``run --verify``), once there is a best to check: its
        launches (``launch_s`` each, the longest probe so far: the check's launch is cold;
        a script's runs launch one by one, each paying the script's start) and
        :data:`VERIFY_RUNS` runs of its steps at ``step_s``, the slowest feasible
        configuration's step (the reference may be a configuration the search never
        measured); at least what a check of the study took before (``checked_s``), which
        also holds the check's own set-up (the reference's memory prediction, the ops)."""
        if not self.verify_steps or feasible < 1:
            return 0.0
        launches_s = self.verify_launches * (launch_s or self.fallback_probe_s)
        estimate_s = launches_s + VERIFY_RUNS * self.verify_steps * step_s
        return max(estimate_s, checked_s)


# Runs of a loss check: the reference twice and the trial (autotune.run.loss_check).
VERIFY_RUNS = 3


def slowest_step_s(trials: Iterable[TrialView]) -> float:
    """The longest median step time of the feasible trials (0 when there is none)."""
    return max((t.record.step_time_s for t in trials if t.feasible), default=0.0)


def longest_probe_s(trials: Iterable[TrialView]) -> float:
    """The longest wall time of the study's probes (0 when there is none)."""
    return max(
        (t.record.probe_wall_s for t in trials if t.record.probe_wall_s is not None), default=0.0
    )
