"""One ``autotune run``: hold the study, set up, search, confirm, export.

Orchestration only; the rules live in the parts:

=====================  ==================================================================
:mod:`~autotune.run._driver_session`   the study, its one-driver lock, heartbeats, Ctrl-C, storage
faults
:mod:`~autotune.memory._memory_screen`    what may fit (memory model, calibration, monotonicity)
:mod:`~autotune.run.budget`    the study's budget, probe-time estimate, confirmation reserve
:mod:`~autotune.run._search`    ask -> screen -> dispatch -> record
:mod:`~autotune.run._confirmation_rounds`   the confirmation round on real probes
:mod:`~autotune.study.best`      which trial is the best, for every output
=====================  ==================================================================

:meth:`Tuner._set_up` recovers the study, builds the ops and the dispatcher;
:meth:`Tuner._search` runs the search and its confirmation round. The budget is the
command's wall time: the clock counts from the command's start (``started_s``), set-up
included, except the one-time build of DeepSpeed's ops: a first run must not spend its
budget compiling. Probing ends early enough for the run's finish (closing
the workers, deciding, exporting) to fit in the budget too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune import events
from autotune.errors import ExecutorError
from autotune.memory import Limits, MemoryScreen
from autotune.run.budget import (
    VERIFY_RUNS,
    BudgetClock,
    ReservePolicy,
    probe_estimate_s,
    read_budget,
)
from autotune.settings import DEFAULT_VERIFY_STEPS
from autotune.study import best, records

if TYPE_CHECKING:
    import optuna

    from autotune.execution import Executor
    from autotune.run._dispatch import InFlight
    from autotune.run._driver_session import DriverSession
    from autotune.run._resolved_run import ResolvedRun
    from autotune.run._search import Search
    from autotune.run.sampler import CandidatePolicy
    from autotune.study import Best, Confirmation, TrialRecord, TrialView
    from autotune.study.loss_checks import LossCheck


# Loss checks of --verify strict at most: the best and up to two runners-up.
STRICT_CHECKS = 3


@dataclass
class RunSummary:
    """What one ``autotune run`` did."""

    study_name: str
    vram_limit_bytes: int
    probes: int = 0
    pruned: int = 0
    duplicates: int = 0
    screened: int = 0  # unevaluated candidates the memory model rules out before sampling
    stop: events.SearchStopped | None = None
    elapsed_s: float = 0.0
    best: Best | None = None
    best_record: TrialRecord | None = None
    export_dir: str | None = None
    exported_config: str | None = None  # the backend's config file in export_dir
    confirmation: Confirmation | None = None  # the round's verdict, None without a round
    loss_check: LossCheck | None = None  # the best's loss check (--verify)
    interrupted: list[int] = field(default_factory=list)


@dataclass
class Heartbeat:
    """What the study lock's heartbeat thread keeps fresh, each part set once the run has
    it: the study's clock, and the heartbeats of the trials being probed
    (``trials_probing``)."""

    session: DriverSession | None = None
    clock: BudgetClock | None = None
    trials_probing: Callable[[], list[optuna.Trial]] | None = None

    def beat(self) -> None:
        """One heartbeat (in the lock's heartbeat thread)."""
        session = self.session
        if session is None:
            return
        if self.clock is not None:
            self.clock.store(session.study)
        if self.trials_probing is not None:
            session.record_heartbeats(self.trials_probing())


class Tuner:
    """Runs one study to its budget; see the module docstring."""

    def __init__(
        self,
        resolved: ResolvedRun,
        *,
        emit: events.Emit = events.ignore,
        executor_factory: Callable[[ResolvedRun], Executor] | None = None,
        fault: str = "none",
        run_flags: dict[str, Any] | None = None,
        started_s: float | None = None,
        on_second_interrupt: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resolved = resolved
        # a reading of ``clock`` (the budget's) when the command started; None: when
        # probing starts
        self._started_s = started_s
        self._clock = clock
        self.emit = emit
        self.run_flags = run_flags or {}
        self._executor_factory = executor_factory or default_executor
        self._fault = fault
        # a second Ctrl-C (see DriverSession); None: it raises KeyboardInterrupt
        self._on_second_interrupt = on_second_interrupt
        settings = resolved.settings
        self.screen = MemoryScreen(
            resolved.workload,
            Limits(
                accelerator=resolved.hardware.accelerator,
                vram_limit_bytes=resolved.config.vram_limit_bytes,
                margin=settings.limits.memory_margin,
                host_ram_bytes=settings.limits.host_ram_bytes
                or resolved.hardware.host_memory_bytes,
                ranks_per_node=resolved.hardware.ranks_on_node(settings.limits.gpus),
            ),
            base_config=resolved.config.base_config,
            use_model=settings.limits.prune,
        )
        checks = settings.search.checks_loss
        self.reserve = ReservePolicy(
            enabled=settings.search.confirm,
            verify_steps=DEFAULT_VERIFY_STEPS if checks else 0,
            verify_launches=VERIFY_RUNS if settings.script is not None else 1,
        )

    def run(self) -> RunSummary:
        from autotune.run._driver_session import DriverSession

        sampler, policy = self.make_sampler()
        summary = RunSummary(
            study_name=self.resolved.study_name,
            vram_limit_bytes=self.resolved.config.vram_limit_bytes,
        )
        heartbeat = Heartbeat()
        with (
            DriverSession(
                self.resolved,
                sampler=sampler,
                run_flags=self.run_flags,
                emit=self.emit,
                on_beat=heartbeat.beat,
                on_second_interrupt=self._on_second_interrupt,
            ) as session,
            session.storage_faults(),
        ):
            settings = self.resolved.settings
            stored = read_budget(session.study)
            clock = BudgetClock(
                stored, settings.search.budget_s, shared=settings.storage.shared, clock=self._clock
            )
            heartbeat.session, heartbeat.clock = session, clock
            self._set_up(session, clock, policy, summary, heartbeat)
            self._finish(session.study, summary)
            clock.finished()
            summary.elapsed_s = clock.elapsed_s
            clock.store(session.study)
        self.emit(events.RunFinished(summary, summary.interrupted))
        return summary

    def _set_up(
        self,
        session: DriverSession,
        clock: BudgetClock,
        policy: CandidatePolicy | None,
        summary: RunSummary,
        heartbeat: Heartbeat,
    ) -> None:
        from autotune.run._dispatch import Dispatcher
        from autotune.run._search import Search

        trials = self._recover(session)
        evaluated = {t.record.candidate_key for t in trials if t.is_evaluation}
        self.emit(
            events.RunStarted(
                study_name=self.resolved.study_name,
                evaluated_before=len(evaluated),
                valid_candidates=self.resolved.space.size(),
                budget_total_s=clock.total_s,
                spent_before_s=clock.spent_before_s,
                left_s=max(clock.run_budget_s, 0.0),
                probe_timeout_s=self.resolved.probe_timeout_s,
            )
        )
        clock.store(session.study)
        summary.screened = self._report_screened(session.study, evaluated)
        estimate_s = probe_estimate_s(trials)
        if clock.run_budget_s <= 0 or clock.run_budget_s < estimate_s:
            short = clock.run_budget_s > 0
            summary.stop = events.SearchStopped(
                "budget",
                spent_s=clock.spent_s,
                total_s=clock.total_s,
                left_s=clock.run_budget_s if short else 0.0,
                probe_estimate_s=estimate_s if short else 0.0,
            )
            return
        ops_build_s = self._prepare_ops()
        dispatcher = Dispatcher(
            self.resolved, self._executor_factory(self.resolved), fault=self._fault
        )
        search = Search(
            self.resolved, session, dispatcher, self.screen, clock, self.reserve, policy, self.emit
        )
        heartbeat.trials_probing = search.trials_in_flight
        clock.start(None if self._started_s is None else self._started_s + ops_build_s)
        search.load(trials)  # its first BudgetUpdated counts the set-up the clock charged
        self._search(session, search, summary)

    def _recover(self, session: DriverSession) -> list[TrialView]:
        """The study's trials, once those a stopped driver left running are failed and
        queued once more (and with ``--retry-failed`` every failed candidate too); the
        memory screen learns what they showed."""
        from autotune.study import requeue_failed

        interrupted = session.recover()
        trials = records.views(session.study)
        for trial in trials:
            if trial.is_evaluation:
                self.screen.learn(trial)
        if interrupted:
            self.emit(events.TrialsRecovered(interrupted, retries=len(interrupted)))
        if self.resolved.settings.search.retry_failed:
            requeued = requeue_failed(session.study, trials)
            # after the replay above, which stopped the precisions their failures stop
            self.screen.forget_failures()
            self.emit(events.FailedRequeued(requeued))
            if requeued:
                trials = records.views(session.study)
        return trials

    def _search(self, session: DriverSession, search: Search, summary: RunSummary) -> None:
        """The search and its confirmation round; the probes still out when it ends are
        stopped, recorded interrupted and queued once more."""
        from autotune.run._confirmation_rounds import ConfirmationRounds

        dispatcher = search.dispatcher
        try:
            summary.stop = search.run()
            self.emit(summary.stop)
            if summary.stop.kind != "interrupted" and self.resolved.settings.search.confirm:
                summary.confirmation = ConfirmationRounds(
                    study=session.study,
                    dispatcher=dispatcher,
                    clock=search.clock,
                    vram_limit_bytes=self.resolved.config.vram_limit_bytes,
                    stopping=lambda: session.stopping,
                    wait_for=search.wait_for,
                    emit=self.emit,
                    keep_s=search.verify_s,
                ).run()
        except ExecutorError:
            # the executor is gone (a lost cluster): probes still out are interrupted
            self._record_interrupted(session, dispatcher.cancel_all(), summary)
            raise
        finally:
            search.clock.probing_done()
            stopped = dispatcher.cancel_all()
            dispatcher.close()
            summary.probes = search.counts.probes
            summary.pruned = search.counts.pruned
            summary.duplicates = search.counts.duplicates
        self._record_interrupted(session, stopped, summary)
        settings = self.resolved.settings
        if session.stopping:
            summary.stop = events.SearchStopped("interrupted")
        elif settings.search.checks_loss and summary.stop.kind != "lock_lost":
            summary.loss_check = self._verify(session)
            search.clock.probing_done()  # the check was held back from the search, not the finish

    def _verify(self, session: DriverSession) -> LossCheck | None:
        """The loss check of the best (``--verify``), after the search's workers are closed
        and before the export, whose summary.md shows it. With ``--verify strict`` a best
        whose check differs is set aside and the next best is checked, up to
        :data:`STRICT_CHECKS` checks (the last best checked may then differ too, and the one
        after it is exported unchecked: summary.md names every trial set aside)."""
        from autotune import training_goal
        from autotune.run.loss_check import LossCheckInterruptedError, check_loss
        from autotune.study import confirmation as confirm
        from autotune.study import loss_checks as checks

        study, strict = session.study, self.resolved.settings.search.verify_strict
        check = None
        for _ in range(STRICT_CHECKS if strict else 1):
            trials = records.views(study)
            decided = best.decide_best(
                trials, confirm.load(study), checks.set_aside(study), training_goal.of_study(study)
            )
            if decided is None or session.stopping:
                break
            try:
                check = check_loss(
                    study,
                    trial=decided.trial,
                    steps=DEFAULT_VERIFY_STEPS,
                    emit=self.emit,
                    strict=strict,
                    cancel=session.stop_requested,
                )
            except LossCheckInterruptedError:  # the first Ctrl-C: export what was decided
                return None
            if not check.set_aside:
                break
        return check

    @staticmethod
    def _record_interrupted(
        session: DriverSession, stopped: list[InFlight], summary: RunSummary
    ) -> None:
        """Probes the run stopped: recorded interrupted, each queued once more."""
        for job in stopped:
            if job.trial is not None:
                records.record_interrupted(session.study, job.trial, job.record)
                session.requeue(job.trial)
                summary.interrupted.append(job.trial.number)

    def _finish(self, study: optuna.Study, summary: RunSummary) -> None:
        """Decide the best (one rule for every output), store it, export it."""
        from autotune import training_goal
        from autotune.export import export
        from autotune.study import confirmation as confirm
        from autotune.study import loss_checks as checks

        trials = records.views(study)
        summary.best = best.decide_best(
            trials, confirm.load(study), checks.set_aside(study), training_goal.of_study(study)
        )
        best.store(study, summary.best)
        if summary.best is None:
            return
        summary.best_record = trials[summary.best.trial].record
        exported = export(study, self.resolved.trials_dir / "best")
        summary.export_dir = str(exported.folder)
        summary.exported_config = exported.config_file

    def make_sampler(self) -> tuple[optuna.samplers.BaseSampler, CandidatePolicy | None]:
        """The study's sampler, and autotune's candidate policy behind it (None under
        Optuna's own samplers): the search's confirmation reserve waits for its coverage."""
        import optuna

        settings = self.resolved.settings
        seed = settings.search.seed
        if settings.search.sampler == "tpe":
            return optuna.samplers.TPESampler(seed=seed), None
        if settings.search.sampler == "gp":
            return optuna.samplers.GPSampler(seed=seed), None
        if settings.search.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed), None
        from autotune.run.sampler import CandidatePolicy, CandidateSampler

        mode = "grid" if settings.search.sampler == "grid" else "model"
        policy = CandidatePolicy(
            list(self.resolved.space.candidates()),
            cost=self._cost_model() if mode == "model" else None,
            may_fit=self.screen.may_fit if settings.limits.prune else None,
            mode=mode,
            goal=self.resolved.goal,
        )
        return CandidateSampler(self.resolved.space, policy, seed=seed), policy

    def _cost_model(self) -> Any:
        from autotune.run.cost_model import machine_cost_model

        resolved = self.resolved
        hardware, threads = resolved.hardware, resolved.config.threads_per_rank
        model, flops = machine_cost_model(
            resolved.workload,
            hardware.accelerator,
            threads=threads,
            precisions=resolved.space.precisions,
            nodes=hardware.nodes_spanned(resolved.config.gpus_per_trial),
            tf32=resolved.config.float32_matmul_precision == "high",
        )
        if flops:
            self.emit(events.CostModelCalibrated(threads, flops))
        return model

    def _report_screened(self, study: optuna.Study, evaluated: set[str]) -> int:
        """With autotune's sampler, candidates the memory model rules out are never
        proposed (so never become trials): count them, keep their keys in the study."""
        from autotune.study import store_screened

        settings = self.resolved.settings
        if not settings.limits.prune or settings.search.sampler != "autotune":
            return 0
        screened = self.screen.screened(list(self.resolved.space.candidates()), evaluated)
        store_screened(study, screened)
        if screened:
            self.emit(
                events.CandidatesScreened(
                    len(screened),
                    self.resolved.space.size() - len(evaluated),
                    self.resolved.config.vram_limit_bytes,
                )
            )
        return len(screened)

    def _prepare_ops(self) -> float:
        """Build the compiled ops the space's candidates need, each backend for its own
        (once per environment, with progress; FSDP2 is torch's own and builds nothing);
        where a backend's optimizer cannot be built, the probes use its fallback (DeepSpeed:
        torch's Adam in place of FusedAdam). Returns the seconds spent compiling (0 when
        every op was built already): the budget leaves them out."""
        from autotune.backends import get_backend

        candidates = list(self.resolved.space.candidates())
        seconds = 0.0
        for name in self.resolved.space.backends:
            own = [c for c in candidates if c.backend == name]
            if not own:
                continue
            targets = {device for c in own for device in (c.offload_optimizer, c.offload_param)} - {
                "none"
            }
            report = get_backend(name).ensure_ops(
                self.resolved.hardware, offload_targets=targets, emit=self.emit
            )
            if report is None:
                continue  # nothing to build
            if report.built:
                self.emit(events.OpsBuilt(tuple(report.built), report.seconds))
                seconds += report.seconds
            self.resolved.torch_adam = self.resolved.torch_adam or report.torch_adam
        return seconds


def default_executor(resolved: ResolvedRun) -> Executor:
    from autotune.execution import make_executor

    return make_executor(
        resolved.settings.probe.executor,
        total_devices=resolved.settings.limits.gpus,
        devices_per_probe=resolved.config.gpus_per_trial,
        cuda=resolved.hardware.accelerator == "cuda",
        cpu_count=resolved.hardware.cpu_count,
        warm=resolved.settings.probe.warm_workers,
        ray_address=resolved.settings.probe.ray_address,
    )
