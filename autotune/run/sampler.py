"""autotune's own Optuna sampler: it proposes whole candidates, ordered by the models.

Optuna's samplers see a define-by-run space of conditional categoricals and learn it from
scratch; autotune knows much more before the first probe: which candidates cannot fit (the
memory model, and monotonicity in the micro-batch), and roughly how fast each one will be
(the cost model). :class:`CandidateSampler` picks the next candidate in
:meth:`~optuna.samplers.BaseSampler.before_trial` and answers each
``suggest_categorical`` of that trial with the candidate's value, so Optuna's storage,
dashboard and enqueue/retry machinery work unchanged.

Policies:

- ``model`` (``--sampler autotune``): among unevaluated candidates that may fit, the
  highest predicted samples/s of the calibrated cost model, times an exploration bonus for
  values no probe has measured yet (a ZeRO stage, precision, offload target, checkpointing
  or micro-batch the model has no data on is where it is least certain). The bonus decays
  as probes accumulate. Under a cost or deadline objective across world sizes, the
  prediction is ranked by the goal's score (samples/s per GPU for cost). Before that,
  every ZeRO stage that may fit is probed once (its
  best-predicted candidate, stages in predicted order): the cost model's stage terms
  (collectives, partitioning, optimizer share) are its crudest, so a stage it misjudges
  would be probed last (benchmarks/RESULTS.md, "Why every ZeRO stage that may fit is
  probed once first").
- ``grid`` (``--sampler grid``): every valid candidate once, in the space's order, for
  exhaustive tables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna

from autotune.candidate import Candidate
from autotune.memory import Monotonicity, shape_key
from autotune.run.cost_model import CostModel
from autotune.training_goal import TrainingGoal

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.trial import FrozenTrial

    from autotune.space import BoundSpace
    from autotune.study import TrialView

EXPLORATION = 0.6  # bonus of a fully novel candidate over its predicted samples/s, at start
# An open candidate predicted this far below the best measured is not worth a probe that the
# confirmation round could use instead (the same margin as a probe's early stop,
# autotune.run._search.EARLY_STOP_MARGIN: clearly slower than the best so far).
PROMISING_MARGIN = 0.05
COVERED_ATTRIBUTES = ("zero_stage",)  # each value that may fit gets one probe first
NOVELTY_ATTRIBUTES = (
    "precision",
    "zero_stage",
    "offload_optimizer",
    "offload_param",
    "checkpoint_fraction",
    "micro_batch_size",
)


@dataclass(frozen=True)
class Settling:
    """Why the search found nothing promising left (:meth:`CandidatePolicy.settling`):
    ``gap``, the share below the best of the best open candidate's prediction (None: no open
    candidate of the best's tier); ``model_error``, the cost model's median leave-one-out
    error on the study's ``probes`` (None: too few probes to say)."""

    gap: float | None
    model_error: float | None
    probes: int


class History:
    """What a study's trials say about candidates (shared by sampler and replays)."""

    def __init__(self) -> None:
        self.evaluated: set[str] = set()
        self.tried: list[Candidate] = []  # every candidate probed or being probed
        self.measured: list[tuple[Candidate, float]] = []  # (candidate, step time s)
        self.monotonicity = Monotonicity()

    def add(self, candidate: Candidate, status: str, step_time_s: float | None) -> None:
        self.evaluated.add(candidate.key)
        self.tried.append(candidate)
        self.monotonicity.add(candidate, status, len(self.tried))
        if status == "ok" and step_time_s:
            self.measured.append((candidate, step_time_s))

    @classmethod
    def of(cls, trials: Iterable[TrialView]) -> History:
        history = cls()
        for trial in trials:
            if not trial.is_evaluation:
                continue
            if trial.running:
                history.evaluated.add(trial.candidate.key)
                history.tried.append(trial.candidate)
                continue
            if trial.status == "interrupted":
                continue  # probed again by the tuner's retry, not by the sampler
            step_time_s = trial.record.step_time_s if trial.status == "ok" else None
            history.add(trial.candidate, trial.status, step_time_s)
        return history

    @classmethod
    def of_study(cls, study: optuna.Study) -> History:
        from autotune.study import views

        return cls.of(views(study))

    def known_to_fit(self, candidate: Candidate) -> bool:
        return self.monotonicity.known_to_fit(candidate)

    def known_not_to_fit(self, candidate: Candidate) -> bool:
        floor = self.monotonicity.oom_floor.get(shape_key(candidate))
        return floor is not None and candidate.micro_batch_size >= floor[0]


class CandidatePolicy:
    """Chooses the next candidate from a history; pure, so benchmarks replay it offline."""

    def __init__(
        self,
        candidates: Sequence[Candidate],
        *,
        cost: CostModel | None,
        may_fit: Callable[[Candidate], bool] | None = None,
        mode: str = "model",
        goal: TrainingGoal | None = None,
    ) -> None:
        self.candidates = list(candidates)
        self.cost = cost
        self.goal = goal or TrainingGoal()
        self.may_fit = may_fit
        self.mode = mode
        self._may_fit_cache: dict[str, bool] = {}

    def _open(self, history: History) -> list[Candidate]:
        open_ = []
        for candidate in self.candidates:
            if candidate.key in history.evaluated or history.known_not_to_fit(candidate):
                continue
            checked = self.mode != "grid" and self.may_fit is not None
            if checked and not history.known_to_fit(candidate) and not self._fits(candidate):
                continue
            open_.append(candidate)
        return open_

    def _fits(self, candidate: Candidate) -> bool:
        fits = self._may_fit_cache.get(candidate.key)
        if fits is None:
            assert self.may_fit is not None
            fits = self._may_fit_cache[candidate.key] = self.may_fit(candidate)
        return fits

    def choose(self, history: History) -> Candidate | None:
        open_ = self._open(history)
        if not open_:
            return None
        if self.mode == "grid" or self.cost is None:
            return open_[0]
        self.cost.fit(history.measured)
        seen = {
            attribute: {getattr(c, attribute) for c, _ in history.measured}
            for attribute in NOVELTY_ATTRIBUTES
        }
        bonus = EXPLORATION / (1.0 + len(history.measured) / 4.0)

        def score(candidate: Candidate) -> tuple[int, float]:
            novel = sum(getattr(candidate, a) not in seen[a] for a in NOVELTY_ATTRIBUTES)
            assert self.cost is not None
            tier, value = self.goal.score(
                self.cost.samples_per_s(candidate), candidate.data_parallel_size
            )
            return tier, value * (1.0 + bonus * novel / len(NOVELTY_ATTRIBUTES))

        return max(self._uncovered(open_, history) or open_, key=score)

    @staticmethod
    def _uncovered(open_: list[Candidate], history: History) -> list[Candidate]:
        tried = {a: {getattr(c, a) for c in history.tried} for a in COVERED_ATTRIBUTES}
        return [c for c in open_ if any(getattr(c, a) not in tried[a] for a in COVERED_ATTRIBUTES)]

    def promising(self, history: History, best: tuple[int, float]) -> bool:
        """Some open candidate is predicted within :data:`PROMISING_MARGIN` of ``best`` (the
        best measured, as the goal scores it: ``(tier, value)``), by the cost model
        calibrated on ``history``; without a model, or before a measurement, everything is."""
        if self.mode != "model" or self.cost is None or not history.measured or best[1] <= 0:
            return True
        open_ = self._open(history)
        if not open_:
            return False
        self.cost.fit(history.measured)
        tier, value = max(
            self.goal.score(self.cost.samples_per_s(c), c.data_parallel_size) for c in open_
        )
        return tier > best[0] or (tier == best[0] and value >= best[1] * (1 - PROMISING_MARGIN))

    def settling(self, history: History, best: tuple[int, float]) -> Settling:
        """What :meth:`promising` compared when it found nothing: how far below ``best`` the
        best-predicted open candidate of the best's tier lies, and the cost model's
        leave-one-out error on ``history``'s probes (:meth:`CostModel.leave_one_out_error
        <autotune.run.cost_model.CostModel.leave_one_out_error>`)."""
        if self.cost is None or best[1] <= 0:
            return Settling(None, None, len(history.measured))
        error = self.cost.leave_one_out_error(history.measured)
        values = [
            value
            for tier, value in (
                self.goal.score(self.cost.samples_per_s(c), c.data_parallel_size)
                for c in self._open(history)
            )
            if tier == best[0]
        ]
        gap = 1.0 - max(values) / best[1] if values else None
        return Settling(gap, error, len(history.measured))

    def covered(self, history: History) -> bool:
        """Every ZeRO stage that may fit has had its probe (the model's search only)."""
        return self.mode != "model" or not self._uncovered(self._open(history), history)


class CandidateSampler(optuna.samplers.BaseSampler):
    """An Optuna sampler whose trials are whole candidates chosen by a :class:`CandidatePolicy`
    (see the module docstring); parameters it has no value for come from a RandomSampler."""

    def __init__(self, space: BoundSpace, policy: CandidatePolicy, seed: int | None = None):
        self.space = space
        self.policy = policy
        self._fallback = optuna.samplers.RandomSampler(seed=seed)
        self._chosen: dict[int, dict[str, Any]] = {}

    def reseed_rng(self) -> None:
        self._fallback.reseed_rng()

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        pick = self.policy.choose(History.of_study(study))
        if pick is not None:
            self._chosen[trial.number] = self.space.params_of(pick)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        params = self._chosen.get(trial.number, {})
        if param_name in params:
            value = params[param_name]
            choices = getattr(param_distribution, "choices", None)
            if choices is None or value in choices:
                return value
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: optuna.trial.TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._chosen.pop(trial.number, None)
