"""The search: ask -> screen -> dispatch -> record, while the budget and the space last.

Optuna proposes, the bound space turns a trial into a :class:`Candidate`; a candidate the
study already evaluated is recorded as a duplicate (never probed twice); the memory screen
records what cannot fit without a probe; the rest go to the executor's slots. Each result is
told to Optuna as soon as it arrives, so the sampler always sees the freshest data.

- After :data:`MAX_DUPLICATES_IN_A_ROW` proposals of evaluated candidates, an unseen one is
  enqueued, so small spaces finish instead of spinning.
- A ZeRO stage's first probe runs in full: it is the stage's one piece of evidence for the
  sampler, and three steps under a passing load can stop the stage's best far below its
  rate. Later probes stop early once clearly slower than the best so far less
  :data:`EARLY_STOP_MARGIN` (never under ``--sampler grid``).
- The search stops when what is left of the budget, less the reserve of the confirmation
  round and of the loss check (``--verify``; :class:`~autotune.run.budget.ReservePolicy`),
  no longer holds the next probe's estimate; on a budget short of the round's resolved, also
  once no open candidate is predicted near the best
  (:meth:`~autotune.run.budget.ReservePolicy.settled`): what is left goes to confirming
  what was found rather than to probes predicted to lose.
- With ``--shared`` other drivers work on the study too: before probing, a trial claims its
  candidate (:meth:`Search._claim`), so none is probed twice.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune import events
from autotune.run.budget import SearchState, longest_probe_s, probe_estimate_s, slowest_step_s
from autotune.study import (
    TrialRecord,
    TrialView,
    loss_checks,
    queued_retries,
    ranked_feasible,
    records,
    retryable,
)
from autotune.study import confirmation as confirm

if TYPE_CHECKING:
    import optuna

    from autotune.candidate import Candidate
    from autotune.memory import MemoryScreen
    from autotune.protocol import ProbeResult
    from autotune.run._dispatch import Dispatcher, InFlight
    from autotune.run._driver_session import DriverSession
    from autotune.run._resolved_run import ResolvedRun
    from autotune.run.budget import BudgetClock, ReservePolicy
    from autotune.run.sampler import CandidatePolicy, Settling

MAX_DUPLICATES_IN_A_ROW = 3
CLAIM_WAIT_S = 5.0  # how long a shared driver waits for an earlier trial's claim to appear
EARLY_STOP_MARGIN = 0.05  # stop a probe whose fast end is 5% below the best so far
POLL_S = 1.0


@dataclass
class Counts:
    probes: int = 0
    pruned: int = 0
    duplicates: int = 0


class Search:
    """One run's search over its study (see the module docstring)."""

    def __init__(
        self,
        resolved: ResolvedRun,
        session: DriverSession,
        dispatcher: Dispatcher,
        screen: MemoryScreen,
        clock: BudgetClock,
        reserve: ReservePolicy,
        policy: CandidatePolicy | None,
        emit: events.Emit,
    ) -> None:
        self.resolved = resolved
        self.study = session.study
        self.session = session
        self.dispatcher = dispatcher
        self.screen = screen
        self.clock = clock
        self.reserve = reserve
        self.policy = policy
        self.emit = emit
        self.counts = Counts()
        self.candidates = {c.key: c for c in resolved.space.candidates()}
        self.evaluated: dict[str, TrialView] = {}  # evaluated candidates by key
        self._stages_probed: set[int] = set()
        self.goal = resolved.goal
        self._best_score = (0, 0.0)  # the best feasible trial's, by the goal
        self._in_a_row = 0
        self._rng = random.Random(resolved.settings.search.seed)
        self.estimate_s = 0.0
        self.reserve_s = 0.0
        self.verify_s = 0.0  # the part of reserve_s held for the loss check
        self.settled = False  # nothing promising left on a budget short of the round's resolved
        self.settling: Settling | None = None  # what the settled search compared
        self._checked_s = max(  # the study's loss checks so far (run --verify's reserve)
            (check.seconds for check in loss_checks.load_all(self.study).values()), default=0.0
        )

    def load(self, trials: list[TrialView]) -> None:
        """Take what the study measured before this run (the screen learns it elsewhere).
        A candidate with a queued retry (an interrupted probe, ``--retry-failed``) is not
        known yet: its retry is its probe, not a duplicate."""
        retrying = queued_retries(trials)
        for trial in trials:
            if not trial.is_evaluation or trial.state not in ("COMPLETE", "PRUNED", "FAIL"):
                continue
            key = trial.record.candidate_key
            if trial.status != "interrupted" and key not in retrying:
                self.evaluated.setdefault(key, trial)
            if trial.record.probe_wall_s is not None:
                self._stages_probed.add(trial.candidate.zero_stage)
            if trial.feasible:
                self._learn_best(trial)
        self._update_estimates(trials)

    def run(self) -> events.SearchStopped:
        """Probe until a stop reason holds and the probes in flight are back (or stopped)."""
        stop: events.SearchStopped | None = None
        while True:
            while stop is None and self.dispatcher.free_slots > 0:
                stop = self._stop_reason()
                if stop is None:
                    self._step()
            if not self.dispatcher.inflight or self.session.stopping:
                break
            for job, result in self.collect():
                self._record(job, result)
        if self.session.stopping:
            return events.SearchStopped("interrupted")
        assert stop is not None
        return stop

    # -- one proposal ----------------------------------------------------------------
    def _step(self) -> None:
        self._steer()
        trial = self.study.ask()
        candidate = self.resolved.space.suggest(trial)
        running = {job.candidate.key: job.number for job in self.dispatcher.inflight}
        if candidate.key in self.evaluated:
            records.record_duplicate(self.study, trial, self.evaluated[candidate.key])
        elif candidate.key in running:
            records.record_running_duplicate(
                self.study, trial, candidate, running[candidate.key] or 0
            )
        else:
            self._in_a_row = 0
            self._evaluate(trial, candidate)
            return
        self.counts.duplicates += 1
        self._in_a_row += 1

    def _steer(self) -> None:
        """Hand the sampler an unseen candidate after too many duplicates in a row."""
        if self._in_a_row < MAX_DUPLICATES_IN_A_ROW:
            return
        unseen = self._unseen()
        if unseen:
            pick = self.candidates[self._rng.choice(sorted(unseen))]
            self.study.enqueue_trial(self.resolved.space.params_of(pick))
        self._in_a_row = 0

    def _evaluate(self, trial: optuna.Trial, candidate: Candidate) -> None:
        from autotune.study import retried_trial

        verdict = self.screen.verdict(candidate)
        prediction = verdict.prediction.model_dump() if verdict.prediction else {}
        record = TrialRecord(
            candidate=candidate,
            candidate_key=candidate.key,
            label=self.resolved.label_of(candidate),
            vram_limit_bytes=self.resolved.config.vram_limit_bytes,
            host_ram_bytes=self.screen.limits.host_ram_bytes,
            retry_of=retried_trial(records.view_of(trial).frozen),
            **prediction,
        )
        if not verdict.fits:
            pruned = record.model_copy(
                update={
                    "pruned_by": verdict.pruned_by,
                    "error": verdict.reason,
                    "oom_trial": verdict.oom_trial,
                }
            )
            records.record_pruned(self.study, trial, pruned, verdict.over_bytes)
            self.evaluated[candidate.key] = records.view_of(trial)
            self.counts.pruned += 1
            self.emit(
                events.CandidatePruned(
                    trial.number, self.resolved.label_of(candidate), verdict.reason
                )
            )
            return
        if self.resolved.settings.storage.shared and not self._claim(trial, candidate, record):
            return
        first_of_stage = candidate.zero_stage not in self._stages_probed
        self._stages_probed.add(candidate.zero_stage)
        self.dispatcher.submit(
            candidate,
            record,
            trial=trial,
            folder=f"trial-{trial.number:04d}",
            stop_below_samples_per_s=0.0
            if first_of_stage
            else self._early_stop_threshold(candidate.data_parallel_size),
        )
        self.session.record_heartbeats([trial])
        self.counts.probes += 1
        self.emit(events.ProbeStarted(trial.number, self.resolved.label_of(candidate)))

    def _claim(self, trial: optuna.Trial, candidate: Candidate, record: TrialRecord) -> bool:
        """With other drivers on the study: whether this trial may probe ``candidate``.
        Every driver writes its claim (the running record) first, then the lowest trial
        number with the candidate wins, so two drivers proposing it at once never both
        probe it; one that another driver evaluated already is a duplicate."""
        import time

        self.session.record_heartbeats([trial])
        records.write(trial, record)
        deadline = time.monotonic() + CLAIM_WAIT_S
        while True:
            others = [t for t in records.views(self.study) if t.number < trial.number]
            unwritten = [t for t in others if t.running and not t.record.candidate_key]
            if not unwritten or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # a driver between ask and its claim: its key is a moment away
        holders = [
            t
            for t in others
            if t.is_evaluation
            and t.record.candidate_key == candidate.key
            and t.status not in ("interrupted", "duplicate")
            and not (record.retry_of is not None and retryable(t))  # what a retry probes again
        ]
        if not holders:
            return True
        if holders[0].running:
            records.record_running_duplicate(self.study, trial, candidate, holders[0].number)
        else:
            records.record_duplicate(self.study, trial, holders[0])
            self.evaluated[candidate.key] = holders[0]
        self.counts.duplicates += 1
        return False

    def _learn_best(self, trial: TrialView) -> None:
        score = self.goal.score(float(trial.value or 0.0), trial.candidate.data_parallel_size)
        self._best_score = max(self._best_score, score)

    def _early_stop_threshold(self, gpus: int) -> float:
        """The samples/s below which a probe at ``gpus`` stops early: clearly short of the
        best so far, by the goal (samples/s per GPU under a cost objective)."""
        settings = self.resolved.settings
        if not settings.probe.early_stop or settings.search.sampler == "grid":
            return 0.0
        return self.goal.rate_to_match(self._best_score, gpus) * (1.0 - EARLY_STOP_MARGIN)

    # -- one result --------------------------------------------------------------------
    def _record(self, job: InFlight, result: ProbeResult) -> None:
        assert job.trial is not None
        over_limits = ""
        if result.lost_node and job.record.retry_of is None:
            # the node died, not the candidate: probed again once, elsewhere
            records.record_interrupted(self.study, job.trial, job.record, result.error)
            self.session.requeue(job.trial)
        else:
            final = records.record_probe(self.study, job.trial, job.record, result)
            over_limits = final.error if result.status == "ok" and not final.feasible else ""
            view = records.view_of(job.trial)
            self.evaluated[job.candidate.key] = view
            self.screen.learn(view)
            if view.feasible:
                self._learn_best(view)
            self._update_estimates(records.views(self.study))
        self.emit(
            events.ProbeFinished(
                job.trial.number,
                self.resolved.label_of(job.candidate),
                result,
                self.resolved.config.vram_limit_bytes,
                f"{job.record.trial_dir}/probe.log",
                over_limits=over_limits,
            )
        )

    def _update_estimates(self, trials: list[TrialView]) -> None:
        from autotune.run.sampler import History

        self.estimate_s = probe_estimate_s(trials)
        ranked = ranked_feasible(trials, self.goal)
        history = History.of(trials)
        covered = self.policy is None or self.policy.covered(history)
        self.verify_s = self.reserve.verify_reserve_s(
            feasible=len(ranked),
            launch_s=longest_probe_s(trials),
            step_s=slowest_step_s(trials),
            checked_s=self._checked_s,
        )
        state = SearchState(
            feasible=len(ranked),
            stages_covered=covered,
            contenders=len(confirm.contenders(ranked, self.goal)),
            full_probe_s=probe_estimate_s(trials, full_only=True),
            probe_s=self.estimate_s,
            budget_s=self.clock.run_budget_s,
        )
        self.reserve_s = self.verify_s + self.reserve.reserve_s(state)
        self.settled = self.reserve.settled(
            state,
            promising=self.policy is None or self.policy.promising(history, self._best_score),
        )
        if self.settled and self.policy is not None:
            self.settling = self.policy.settling(history, self._best_score)
        self.emit(
            events.BudgetUpdated(
                self.clock.spent_s,
                self.clock.total_s,
                self.reserve_s,
                self.estimate_s,
                finish_s=self.clock.finish_s,
                verify_s=self.verify_s,
            )
        )

    # -- when to stop --------------------------------------------------------------------
    def _unseen(self) -> list[str]:
        running = {job.candidate.key for job in self.dispatcher.inflight}
        return [k for k in self.candidates if k not in self.evaluated and k not in running]

    def _stop_reason(self) -> events.SearchStopped | None:
        settings = self.resolved.settings
        if self.session.stopping:
            return events.SearchStopped("interrupted")
        if self.session.lost:
            return events.SearchStopped("lock_lost", holder=self.session.lost)
        if (
            settings.search.max_trials is not None
            and self.counts.probes >= settings.search.max_trials
        ):
            return events.SearchStopped("max_trials", max_trials=settings.search.max_trials)
        left_s = self.clock.probing_left_s
        if left_s - self.reserve_s <= 0 or left_s - self.reserve_s < self.estimate_s:
            short = left_s - self.reserve_s > 0
            return events.SearchStopped(
                "budget",
                spent_s=self.clock.spent_s,
                total_s=self.clock.total_s,
                reserve_s=min(self.reserve_s, max(left_s, 0.0)),
                verify_s=min(self.verify_s, max(left_s, 0.0)),
                left_s=left_s - self.reserve_s if short else 0.0,
                probe_estimate_s=self.estimate_s if short else 0.0,
            )
        if not self._unseen():
            return events.SearchStopped("exhausted")
        if self.settled:
            settling = self.settling
            return events.SearchStopped(
                "settled",
                spent_s=self.clock.spent_s,
                total_s=self.clock.total_s,
                reserve_s=left_s,
                predicted_gap=settling.gap if settling else None,
                model_error=settling.model_error if settling else None,
                probes=settling.probes if settling else 0,
            )
        return None

    def trials_in_flight(self) -> list[optuna.Trial]:
        """The search trials being probed now (the lock's heartbeat keeps theirs fresh)."""
        return [job.trial for job in self.dispatcher.inflight if job.trial]

    def collect(self) -> list[tuple[InFlight, ProbeResult]]:
        """Results that arrive within a poll; how far the others are goes out as events."""
        done = self.dispatcher.collect(POLL_S)
        for job, (phase, steps) in self.dispatcher.progress().items():
            self.emit(
                events.ProbeProgress(
                    job.number, self.resolved.label_of(job.candidate), phase, steps
                )
            )
        return done

    def wait_for(self, job: InFlight) -> ProbeResult | None:
        """Block until ``job`` is back (None if the run is stopping first); other results
        that arrive meanwhile are recorded."""
        while not self.session.stopping:
            for done, result in self.collect():
                if done is job:
                    return result
                self._record(done, result)
        return None
