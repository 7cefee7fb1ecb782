"""The ask/tell loop: the driver process, the only writer of the study.

Optuna proposes, the bound space turns a trial into a :class:`Candidate`, a candidate the
study already evaluated is recorded as a duplicate (never probed twice), and new ones go to
the executor while budget and slots remain. Each result is told to Optuna as soon as it
arrives, so the sampler always sees the freshest data. When the run ends the best feasible
trial is exported to ``trials/<study>/best/``.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from autotune.candidate import Candidate
from autotune.errors import StorageError
from autotune.lock import DriverLock
from autotune.memory import Calibration
from autotune.settings import DEFAULT_BUDGET_S, format_bytes, format_duration
from autotune.study import (
    FLAGS_ATTR,
    METRIC,
    is_duplicate,
    is_repeat,
    open_storage,
    record_duplicate,
    record_result,
    record_running_duplicate,
    study_config,
)

if TYPE_CHECKING:
    import optuna

    from autotune.confirm import Contender
    from autotune.cost import CostModel
    from autotune.executor import Executor
    from autotune.memory import MemoryModel
    from autotune.plan import Plan
    from autotune.protocol import ProbeResult
    from autotune.sampler import CandidatePolicy

# After this many proposals in a row of already-evaluated candidates, the tuner hands the
# sampler an unseen candidate (enqueued), so small spaces finish instead of spinning.
SCREENED_ATTR = "autotune_screened"
MAX_DUPLICATES_IN_A_ROW = 3
POLL_S = 1.0
EARLY_STOP_MARGIN = 0.05  # stop a probe whose fast end is 5% below the best so far
BUDGET_ATTR = "autotune_budget"  # {"total_s", "spent_s"}: the study's budget, across runs
DEFAULT_STORAGE = "sqlite:///trials/autotune.db"


def _first_line(exc: BaseException) -> str:
    """The root cause's first line (Optuna wraps SQLAlchemy's error, which wraps the
    driver's, e.g. sqlite3's "database is locked")."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _storage_errors() -> tuple[type[BaseException], ...]:
    import optuna
    import sqlalchemy.exc

    return (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError)


class RunSummary(BaseModel):
    """What one ``autotune run`` did."""

    model_config = ConfigDict(extra="forbid")

    study_name: str
    probes: int = 0
    pruned: int = 0
    duplicates: int = 0
    stop_reason: str = ""
    elapsed_s: float = 0.0
    best_trial: int | None = None
    best_label: str = ""
    best_samples_per_s: float = 0.0
    best_tokens_per_s: float = 0.0
    best_peak_bytes: int = 0
    vram_limit_bytes: int = 0
    export_path: str | None = None
    confirmation: str = ""
    screened: int = 0  # unevaluated candidates the memory model rules out before sampling


@dataclass
class _InFlight:
    trial: optuna.Trial
    candidate: Candidate
    ds_config: dict
    trial_dir: Path
    started: float


class Tuner:
    """Runs one study to its budget; see the module docstring."""

    def __init__(
        self,
        plan: Plan,
        *,
        log: Callable[[str], None] = print,
        executor_factory: Callable[[Plan], Executor] | None = None,
        fault: str = "none",
        run_flags: dict[str, object] | None = None,
    ) -> None:
        self.plan = plan
        self.run_flags = run_flags or {}
        self.log = log
        self._executor_factory = executor_factory or default_executor
        self._fault = fault
        self._rng = random.Random(plan.settings.seed)
        self._calibration = Calibration()
        self._memory: MemoryModel | None = None
        self._predictions: dict[int, dict[str, object]] = {}
        self._oom_floor: dict[str, tuple[int, int]] = {}  # shape -> (smallest oom mb, trial)
        self._fit_ceiling: dict[str, int] = {}  # shape -> largest micro-batch that fitted
        self._verdicts: dict[str, tuple[str, float, dict[str, object]]] = {}
        self._retries: list[tuple[str, int]] = []
        self._policy: CandidatePolicy | None = None  # autotune's own sampler, when used
        self._stopping = False
        self._lock: DriverLock | None = None
        self._spent_before_s = 0.0
        self._budget_total_s = DEFAULT_BUDGET_S
        self._run_started = time.monotonic()

    # -- study -------------------------------------------------------------------------
    def open_study(self) -> optuna.Study:
        import warnings

        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        storage = open_storage(self.plan.settings.storage_url)
        sampler = self._make_sampler()
        study = optuna.create_study(
            study_name=self.plan.study_name,
            storage=storage,
            sampler=sampler,
            direction="maximize",
            load_if_exists=True,
        )
        stored = study_config(study)
        if stored is None:
            study.set_user_attr("autotune_config", self.plan.config.model_dump(mode="json"))
            study.set_user_attr(FLAGS_ATTR, self.run_flags)
            study.set_metric_names([METRIC])
        elif stored != self.plan.config:
            diffs = "; ".join(stored.differences(self.plan.config))
            raise StorageError(
                f"study {self.plan.study_name!r} was measured with other settings: {diffs}; "
                f"drop those flags to continue it with its own, or add --study NEW_NAME to "
                "start a new study with them"
            )
        return study

    def _make_sampler(self) -> optuna.samplers.BaseSampler:
        import optuna

        settings = self.plan.settings
        seed = settings.seed
        if settings.sampler == "tpe":
            return optuna.samplers.TPESampler(seed=seed)
        if settings.sampler == "gp":
            return optuna.samplers.GPSampler(seed=seed)
        if settings.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        from autotune.sampler import CandidatePolicy, CandidateSampler

        mode = "grid" if settings.sampler == "grid" else "model"
        policy = CandidatePolicy(
            list(self.plan.space.candidates()),
            cost=self.cost_model() if mode == "model" else None,
            may_fit=self._may_fit if settings.prune else None,
            mode=mode,
        )
        self._policy = policy
        return CandidateSampler(self.plan.space, policy, seed=seed)

    def cost_model(self) -> CostModel:
        from autotune.cost import CostModel, WorkloadFacts
        from autotune.memory import model_facts

        workload = self.plan.workload
        facts = WorkloadFacts(model_facts(workload, 0).params, workload.tokens_per_sample)
        hardware, threads = self.plan.hardware, self.plan.config.threads_per_rank
        scale: dict[str, float] = {}
        if hardware.accelerator == "cpu":
            from autotune.cost import compute_scale_from, measure_cpu_matmul_flops

            measured = tuple(dict.fromkeys(("fp32", *self.plan.space.precisions)))  # fp32: anchor
            flops = measure_cpu_matmul_flops(measured, threads)
            scale = compute_scale_from(flops)
            rates = ", ".join(f"{p} {rate / 1e9:.0f}" for p, rate in flops.items())
            self.log(
                f"cost model: this CPU's matmul GFLOP/s at {threads} thread(s) per rank: {rates}"
            )
        return CostModel(facts, hardware.accelerator, threads=threads, compute_scale=scale)

    def _may_fit(self, candidate: Candidate) -> bool:
        """What the memory model says before any probe (the sampler skips the rest)."""
        return self._memory_verdict(candidate)[0] == ""

    def _report_screened(
        self,
        study: optuna.Study,
        all_candidates: dict[str, Candidate],
        known: dict[str, optuna.trial.FrozenTrial],
    ) -> int:
        """With autotune's sampler, candidates the memory model rules out are never
        proposed (so never become trials); say how many, and keep their keys in the study
        (``autotune_screened``) so that summary.md counts them too."""
        settings = self.plan.settings
        if not settings.prune or settings.sampler != "autotune" or self._memory_model() is None:
            return 0
        screened = [
            key
            for key, candidate in all_candidates.items()
            if key not in known
            and candidate.micro_batch_size > self._fit_ceiling.get(self._shape_key(candidate), 0)
            and not self._may_fit(candidate)
        ]
        study.set_user_attr(SCREENED_ATTR, screened)
        if screened:
            limit = self.plan.config.vram_limit_bytes / 2**30
            self.log(
                f"memory model: {len(screened)} of {len(all_candidates) - len(known)} "
                f"unevaluated candidate(s) predicted over the {limit:.2f} GiB limit per rank "
                "(or the host's memory); the sampler skips them (autotune plan --all shows "
                "each prediction)"
            )
        return len(screened)

    def _review_history(self, study: optuna.Study) -> dict[str, optuna.trial.FrozenTrial]:
        """Evaluated candidates by key. Trials a dead driver left RUNNING become FAIL with
        status ``interrupted``; an interrupted candidate is probed again once (its retry
        carries ``retry_of``); an interrupted retry is given up."""
        from optuna.trial import TrialState

        trials = [t for t in study.get_trials(deepcopy=False) if not is_repeat(t)]
        retried = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
        known: dict[str, optuna.trial.FrozenTrial] = {}
        interrupted: list[optuna.trial.FrozenTrial] = []
        for trial in trials:
            key = trial.user_attrs.get("candidate_key")
            if key is None:
                continue
            if trial.state == TrialState.RUNNING:
                study._storage.set_trial_user_attr(trial._trial_id, "status", "interrupted")
                study._storage.set_trial_user_attr(
                    trial._trial_id, "error", "interrupted: its driver stopped during the probe"
                )
                study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
                trial = study.get_trials(deepcopy=False)[trial.number]
                self.log(f"trial {trial.number} was left running by a stopped driver")
            status = trial.user_attrs.get("status")
            if status == "interrupted" and "retry_of" not in trial.user_attrs:
                if trial.number not in retried:
                    interrupted.append(trial)
                continue
            if trial.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL):
                known.setdefault(key, trial)
            if status in ("oom", "ok"):
                candidate = Candidate.model_validate(trial.user_attrs["candidate"])
                self._note_outcome(candidate, status, trial.number)
        self._retries = [
            (t.user_attrs["candidate_key"], t.number)
            for t in interrupted
            if t.user_attrs["candidate_key"] not in known
        ]
        if self._retries:
            self.log(f"{len(self._retries)} interrupted candidate(s) will be probed again, once")
        return known

    def _probe_estimate_s(self, study: optuna.Study) -> float:
        """Median wall time of the study's probes: what the next one will likely take."""
        return _median_wall_s(study, full_only=False)

    # -- budget, lock, signals ---------------------------------------------------------
    def _open_budget(self, study: optuna.Study) -> float:
        """The seconds this run may use: the study's total less what it spent before. A
        given --budget sets a new total; otherwise the stored one (or the default) holds."""
        stored = study.user_attrs.get(BUDGET_ATTR) or {}
        self._spent_before_s = float(stored.get("spent_s", 0.0))
        given = self.plan.settings.budget_s
        total = given if given is not None else float(stored.get("total_s", DEFAULT_BUDGET_S))
        self._budget_total_s = total
        self._run_started = time.monotonic()
        study.set_user_attr(BUDGET_ATTR, self._budget_attr())
        return total - self._spent_before_s

    def _budget_attr(self) -> dict[str, float]:
        spent = self._spent_before_s + (time.monotonic() - self._run_started)
        return {"total_s": self._budget_total_s, "spent_s": round(spent, 1)}

    def _on_sigint(self, signum: int, frame: object) -> None:
        """First Ctrl-C: stop asking, the loop cancels probes and exports. Second: kill the
        probe groups and leave at once; SQLite/PostgreSQL roll back an open transaction."""
        if self._stopping:
            from autotune.launch import kill_all_groups

            kill_all_groups()
            os.write(2, b"autotune: interrupted twice: exiting now, probes killed\n")
            os._exit(130)
        self._stopping = True
        self.log(
            "interrupt: stopping; running probes are stopped and recorded as interrupted, "
            "the best so far is exported (Ctrl-C again to exit at once)"
        )

    def _budget_spent_reason(self, reserve_s: float = 0.0) -> str:
        """Why the search stopped; ``reserve_s``: the budget's last seconds, kept for the
        confirmation round that follows (said so, or "1m33s of 1m55s" reads as unused)."""
        spent = self._budget_attr()["spent_s"]
        used = f"{format_duration(spent)} of the study's {format_duration(self._budget_total_s)}"
        if reserve_s >= 1:
            used = (
                f"search {used}, the last {format_duration(reserve_s)} kept for the "
                "confirmation round"
            )
        return (
            f"budget spent ({used}); to go on, give a larger total: "
            f"{self.continue_command()} --budget {format_duration(spent + reserve_s + 600)}"
        )

    def continue_command(self) -> str:
        command = f"autotune run --study {self.plan.study_name}"
        if self.plan.settings.storage_url != DEFAULT_STORAGE:
            command += f" --storage {self.plan.settings.storage_url}"
        return command

    # -- loop --------------------------------------------------------------------------
    def run(self) -> RunSummary:
        """Hold the study, run it to its budget, export; storage faults become one error."""
        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, self._on_sigint) if in_main_thread else None
        lock: DriverLock | None = None
        try:
            study = self.open_study()
            lock = DriverLock(
                study, on_beat=lambda: {BUDGET_ATTR: self._budget_attr()}, log=self.log
            )
            lock.acquire()
            self._lock = lock
            return self._run_held(study)
        except _storage_errors() as exc:
            raise StorageError(
                f"the storage {self.plan.settings.storage_url} failed ({_first_line(exc)}); "
                "every trial recorded before is kept; fix it (another process holding the "
                f"database locked?), then continue with {self.continue_command()}"
            ) from None
        finally:
            if in_main_thread:
                signal.signal(signal.SIGINT, previous)
            if lock is not None:
                lock.release()

    def _run_held(self, study: optuna.Study) -> RunSummary:
        plan = self.plan
        settings = plan.settings
        budget_s = self._open_budget(study)
        deadline = time.monotonic() + budget_s
        known = self._review_history(study)
        self._calibrate_from(study)
        all_candidates = {c.key: c for c in plan.space.candidates()}
        summary = RunSummary(
            study_name=plan.study_name, vram_limit_bytes=plan.config.vram_limit_bytes
        )
        spent = format_duration(self._spent_before_s)
        self.log(
            f"study {plan.study_name!r}: {len(known)} candidate(s) evaluated before, "
            f"{len(all_candidates)} valid in the space; budget "
            f"{format_duration(self._budget_total_s)}, {spent} spent before, "
            f"{format_duration(max(budget_s, 0))} left; probe timeout "
            f"{format_duration(plan.probe_timeout_s)}"
        )
        summary.screened = self._report_screened(study, all_candidates, known)
        if budget_s <= 0 or budget_s < self._probe_estimate_s(study):
            summary.stop_reason = self._budget_spent_reason()
            self._finish(study, summary)
            return summary
        self._prepare_ops()
        executor = self._executor_factory(plan)
        inflight: dict[int, _InFlight] = {}
        estimate_s = self._probe_estimate_s(study)
        reserve_s = self._confirmation_reserve_s(study, budget_s, estimate_s)
        duplicates_in_a_row = 0
        stop_reason = ""
        failure: BaseException | None = None
        try:
            while True:
                while len(inflight) < executor.capacity and not stop_reason:
                    if self._stopping:
                        stop_reason = "interrupted"
                        break
                    if self._lock is not None and self._lock.lost:
                        stop_reason = f"another driver took the study over ({self._lock.lost})"
                        break
                    if settings.max_trials is not None and summary.probes >= settings.max_trials:
                        stop_reason = f"--max-trials {settings.max_trials} reached"
                        break
                    remaining = deadline - time.monotonic() - reserve_s
                    if remaining <= 0 or remaining < estimate_s:
                        left_s = max(deadline - time.monotonic(), 0.0)
                        stop_reason = self._budget_spent_reason(min(reserve_s, left_s))
                        break
                    running = {job.candidate.key: job.trial.number for job in inflight.values()}
                    unseen = [k for k in all_candidates if k not in known and k not in running]
                    if not unseen:
                        stop_reason = "every valid candidate has been evaluated"
                        break
                    retry_of = None
                    while self._retries and retry_of is None:
                        key, number = self._retries.pop(0)
                        if key in all_candidates and key not in known and key not in running:
                            study.enqueue_trial(
                                plan.space.params_of(all_candidates[key]),
                                user_attrs={"retry_of": number},
                            )
                            retry_of = number
                    if retry_of is None and duplicates_in_a_row >= MAX_DUPLICATES_IN_A_ROW:
                        pick = all_candidates[self._rng.choice(sorted(unseen))]
                        study.enqueue_trial(plan.space.params_of(pick))
                        duplicates_in_a_row = 0
                    trial = study.ask()
                    candidate = plan.space.suggest(trial)
                    if candidate.key in known or candidate.key in running:
                        if candidate.key in known:
                            record_duplicate(study, trial, known[candidate.key])
                        else:
                            record_running_duplicate(study, trial, running[candidate.key])
                        summary.duplicates += 1
                        duplicates_in_a_row += 1
                        continue
                    duplicates_in_a_row = 0
                    if self._screen(study, trial, candidate):
                        known[candidate.key] = study.get_trials(deepcopy=False)[trial.number]
                        summary.pruned += 1
                        continue
                    # A ZeRO stage's first probe runs in full: it is the stage's one piece
                    # of evidence for the sampler, and 3 steps under a passing load (other
                    # processes, a cold cache) can stop the stage's best far below its rate.
                    covered = self._probed_stages(study, inflight.values())
                    ticket, job = self._submit(
                        executor,
                        study,
                        trial,
                        candidate,
                        early_stop=candidate.zero_stage in covered,
                    )
                    inflight[ticket] = job
                    summary.probes += 1
                if not inflight or (self._stopping and stop_reason == "interrupted"):
                    break
                for ticket, result in executor.wait(POLL_S):
                    job = inflight.pop(ticket)
                    self._record(study, job, result)
                    known[job.candidate.key] = study.get_trials(deepcopy=False)[job.trial.number]
                    estimate_s = self._probe_estimate_s(study)
                    reserve_s = self._confirmation_reserve_s(study, budget_s, estimate_s)
                if self._stopping:
                    stop_reason = "interrupted"
            if not self._stopping and settings.confirm:
                summary.confirmation = self._confirm(study, executor, inflight, deadline)
                if self._stopping:
                    stop_reason = "interrupted"
        except (*_storage_errors(), OSError) as exc:
            failure = exc
            stop_reason = "storage failed"
        finally:
            if inflight:
                # Whole process groups, ranks included, before anything else happens.
                executor.cancel_all()
            executor.close()
        if inflight and failure is None:
            self._record_interrupted(study, inflight.values())
        summary.stop_reason = stop_reason
        summary.elapsed_s = time.monotonic() - self._run_started
        study.set_user_attr(BUDGET_ATTR, self._budget_attr())
        if failure is not None:
            if isinstance(failure, OSError):
                raise StorageError(
                    f"cannot write the run's files ({_first_line(failure)}); every trial "
                    "recorded before is kept; free space or fix the folder, then continue "
                    f"with {self.continue_command()}"
                ) from None
            raise failure
        self._finish(study, summary)
        if stop_reason == "interrupted":
            self.log(
                f"interrupted: {len(inflight)} running probe(s) stopped and recorded as "
                f"interrupted (probed again on continue); continue with: "
                f"{self.continue_command()}"
            )
        return summary

    # -- confirmation --------------------------------------------------------------------
    def _confirmation_reserve_s(
        self, study: optuna.Study, budget_s: float, estimate_s: float
    ) -> float:
        if not self.plan.settings.confirm:
            return 0.0
        from autotune import confirm
        from autotune.export import feasible_trials

        # Confirmation probes run in full: time them by the probes that were not stopped
        # early (an early-stopped one is a fraction of a probe).
        feasible = feasible_trials(study)
        if len(feasible) < 2:
            # nothing to confirm yet: holding time back would only end the search sooner
            # (a search stopped with one feasible config never gets to a round)
            return 0.0
        if self._policy is not None:
            from autotune.sampler import History

            if not self._policy.covered(History.of_study(study)):
                # the search's least is one probe of every ZeRO stage that may fit: on a
                # short budget, confirming two configs before ZeRO-0 was ever probed
                # confirmed the wrong ones (DeepSpeed comparison, 2026-12-01)
                return 0.0
        probe_s = self._full_probe_estimate_s(study) or estimate_s or 20.0
        return confirm.reserve_s(probe_s, len(confirm.contenders(feasible)), budget_s)

    @staticmethod
    def _full_probe_estimate_s(study: optuna.Study) -> float:
        return _median_wall_s(study, full_only=True)

    def _confirm(
        self,
        study: optuna.Study,
        executor: Executor,
        inflight: dict[int, _InFlight],
        deadline: float,
    ) -> str:
        """Probe the contenders again, interleaved, and store the verdict (see confirm.py)."""
        from autotune import confirm
        from autotune.export import feasible_trials

        chosen = confirm.contenders(feasible_trials(study))
        if len(chosen) < 2:
            return ""
        verdict = confirm.Confirmation(
            contenders=[
                confirm.Contender(
                    trial=t.number, label=t.user_attrs["label"], samples_per_s=[float(t.value)]
                )
                for t in chosen
            ]
        )
        started = time.monotonic()
        by_trial = {c.trial: c for c in verdict.contenders}
        self.log(
            f"confirming {len(chosen)} contender(s), interleaved: "
            + ", ".join(t.user_attrs["label"] for t in chosen)
        )
        by_number = {t.number: t for t in chosen}
        confirm.run_rounds(
            verdict,
            lambda numbers: self._confirmation_round(
                study, executor, inflight, [by_number[n] for n in numbers], by_trial, deadline
            ),
        )
        verdict.seconds = round(time.monotonic() - started, 1)
        verdict.after_trial = len(study.get_trials(deepcopy=False)) - 1
        study.set_user_attr(confirm.CONFIRMATION_ATTR, verdict.model_dump(mode="json"))
        text = verdict.describe()
        self.log(f"confirmation ({verdict.rounds} round(s), {verdict.seconds:.0f} s): {text}")
        return text

    def _confirmation_round(
        self,
        study: optuna.Study,
        executor: Executor,
        inflight: dict[int, _InFlight],
        originals: list[optuna.trial.FrozenTrial],
        by_trial: dict[int, Contender],
        deadline: float,
    ) -> bool:
        """Probe each of ``originals`` once more, in order; False if there was no time for
        the whole round or the run is stopping (a partial round is not counted)."""
        probe_s = self._full_probe_estimate_s(study) or self._probe_estimate_s(study)
        round_s = len(originals) * max(probe_s, 1.0)
        if self._stopping or time.monotonic() + round_s > deadline:
            return False
        for original in originals:
            if self._stopping:
                return False
            candidate = Candidate.model_validate(original.user_attrs["candidate"])
            study.enqueue_trial(
                self.plan.space.params_of(candidate),
                user_attrs={"confirmation_of": original.number},
            )
            trial = study.ask()
            candidate = self.plan.space.suggest(trial)
            ticket, job = self._submit(executor, study, trial, candidate, early_stop=False)
            inflight[ticket] = job
            result = None
            while result is None and not self._stopping:
                for done_ticket, done in executor.wait(POLL_S):
                    inflight.pop(done_ticket)
                    self._record(study, job, done)
                    result = done
            if result is not None and result.status == "ok":
                by_trial[original.number].samples_per_s.append(result.samples_per_s)
        return not self._stopping

    def _record_interrupted(self, study: optuna.Study, jobs: Iterable[_InFlight]) -> None:
        from optuna.trial import TrialState

        for job in jobs:
            prediction = self._predictions.pop(job.trial.number, {})
            for key, value in prediction.items():
                job.trial.set_user_attr(key, value)
            job.trial.set_user_attr("status", "interrupted")
            job.trial.set_user_attr("error", "interrupted: the run was stopped during the probe")
            study.tell(job.trial, state=TrialState.FAIL)

    # -- out of memory ---------------------------------------------------------------
    @staticmethod
    def _shape_key(candidate: Candidate) -> str:
        from autotune.sampler import shape_key

        return shape_key(candidate)

    def _note_outcome(self, candidate: Candidate, status: str, trial_number: int) -> None:
        """Memory is monotonic in the micro-batch: an OOM at m rules out larger ones; a fit
        at m vouches for smaller ones (the memory model is not asked about those)."""
        shape = self._shape_key(candidate)
        if status == "oom":
            floor = self._oom_floor.get(shape)
            if floor is None or candidate.micro_batch_size < floor[0]:
                self._oom_floor[shape] = (candidate.micro_batch_size, trial_number)
        elif status == "ok":
            ceiling = self._fit_ceiling.get(shape, 0)
            self._fit_ceiling[shape] = max(ceiling, candidate.micro_batch_size)

    # -- memory ----------------------------------------------------------------------
    def _memory_model(self) -> MemoryModel | None:
        if not self.plan.settings.prune:
            return None
        if self._memory is None:
            from autotune.memory import MemoryModel

            self._memory = MemoryModel(
                self.plan.workload,
                base_config=self.plan.config.base_config,
                calibration=self._calibration,
            )
        return self._memory

    def _calibrate_from(self, study: optuna.Study) -> None:
        """Every probe that measured a peak corrects later predictions of the study."""
        from autotune.candidate import Candidate

        for trial in study.get_trials(deepcopy=False):
            attrs = trial.user_attrs
            if attrs.get("status") == "ok" and attrs.get("predicted_raw_bytes"):
                self._calibration.add(
                    Candidate.model_validate(attrs["candidate"]),
                    attrs["predicted_raw_bytes"],
                    attrs.get("peak_bytes", 0),
                )

    def _screen(self, study: optuna.Study, trial: optuna.Trial, candidate: Candidate) -> bool:
        """Record ``candidate`` as infeasible without a probe when the memory model says it
        cannot fit; otherwise remember the prediction for the trial and return False."""
        from autotune.study import record_pruned

        plan = self.plan
        floor = self._oom_floor.get(self._shape_key(candidate))
        if floor is not None and candidate.micro_batch_size > floor[0]:
            reason = (
                f"micro-batch {candidate.micro_batch_size} is larger than "
                f"{floor[0]}, which ran out of memory in trial {floor[1]}"
            )
            record_pruned(
                study,
                trial,
                candidate,
                pruned_by=f"oom at micro-batch {floor[0]}",
                reason=reason,
                over_bytes=1.0,
                attrs={"vram_limit_bytes": plan.config.vram_limit_bytes, "oom_trial": floor[1]},
            )
            self.log(f"trial {trial.number}: {candidate.label} -> infeasible, not probed: {reason}")
            return True
        model = self._memory_model()
        if model is None:
            return False
        reason, over, attrs = self._memory_verdict(candidate)
        self._predictions[trial.number] = attrs
        if not reason:
            return False
        if candidate.micro_batch_size <= self._fit_ceiling.get(self._shape_key(candidate), 0):
            self.log(
                f"trial {trial.number}: {candidate.label}: the memory model says it will not "
                "fit, but a larger micro-batch of it did; probing it"
            )
            return False
        record_pruned(
            study,
            trial,
            candidate,
            pruned_by="memory-model",
            reason=reason,
            over_bytes=over,
            attrs={**attrs, "vram_limit_bytes": plan.config.vram_limit_bytes},
        )
        self.log(f"trial {trial.number}: {candidate.label} -> infeasible, not probed: {reason}")
        return True

    def _memory_verdict(self, candidate: Candidate) -> tuple[str, float, dict[str, object]]:
        """(why it cannot fit or "", by how many bytes, the prediction's attrs)."""
        plan = self.plan
        model = self._memory_model()
        if model is None:
            return "", 0.0, {}
        estimate = model.predict(candidate)
        predicted = estimate.tracked_bytes(plan.hardware.accelerator)
        host = estimate.host_bytes * plan.config.gpus_per_trial
        limit = plan.config.vram_limit_bytes
        threshold = limit * (1.0 - plan.settings.memory_margin)
        host_ram = plan.settings.host_ram_bytes or plan.hardware.host_memory_bytes
        attrs: dict[str, object] = {
            "predicted_peak_bytes": predicted,
            "predicted_raw_bytes": int(predicted / estimate.correction),
            "predicted_host_bytes": estimate.host_bytes,
            "predicted_phase": estimate.phase,
            "memory_correction": estimate.correction,
        }
        if predicted > threshold:
            reason = (
                f"predicted peak {format_bytes(predicted)} per rank exceeds the limit "
                f"{format_bytes(limit)} less the {100 * plan.settings.memory_margin:.0f}% margin"
            )
            return reason, predicted - threshold, attrs
        if plan.hardware.accelerator == "cuda" and host > host_ram:
            reason = (
                f"predicted host memory {format_bytes(host)} per node exceeds --host-ram "
                f"{format_bytes(host_ram)}"
            )
            return reason, host - host_ram, attrs
        return "", 0.0, attrs

    def _submit(
        self,
        executor: Executor,
        study: optuna.Study,
        trial: optuna.Trial,
        candidate: Candidate,
        *,
        early_stop: bool = True,
    ) -> tuple[int, _InFlight]:
        from autotune.launch import ProbeJob
        from autotune.protocol import ProbeSpec

        plan = self.plan
        settings = plan.settings
        trial_dir = plan.trials_dir / f"trial-{trial.number:04d}"
        nvme_dir = None
        if plan.config.nvme_path and "nvme" in (
            candidate.offload_optimizer,
            candidate.offload_param,
        ):
            # Concurrent probes must not share DeepSpeed's swap folders.
            nvme_dir = str(
                Path(plan.config.nvme_path) / "autotune" / plan.study_name / trial_dir.name
            )
            Path(nvme_dir).mkdir(parents=True, exist_ok=True)
        ds_config = plan.ds_config(candidate, nvme_dir)
        for key, value in {
            "candidate": candidate.model_dump(mode="json"),
            "candidate_key": candidate.key,
            "label": candidate.label,
            "status": "running",
            "trial_dir": str(trial_dir),
        }.items():
            trial.set_user_attr(key, value)
        spec = ProbeSpec(
            workload=plan.workload_ref,
            candidate=candidate,
            ds_config=ds_config,
            accelerator=plan.hardware.accelerator,
            vram_limit_bytes=plan.config.vram_limit_bytes,
            device_memory_bytes=plan.hardware.device_memory_bytes,
            warmup_steps=settings.warmup_steps,
            max_warmup_steps=settings.warmup_steps + 4,
            timed_steps=settings.timed_steps,
            max_timed_steps=max(settings.max_timed_steps, settings.timed_steps),
            stop_below_samples_per_s=self._early_stop_threshold(study) if early_stop else 0.0,
            tokens_per_sample=plan.workload.tokens_per_sample,
            fault=self._fault,
        )
        job = ProbeJob(
            spec=spec,
            trial_dir=str(trial_dir),
            world_size=candidate.data_parallel_size,
            timeout_s=plan.probe_timeout_s,
            threads_per_rank=plan.config.threads_per_rank,
            cwd=str(Path.cwd()),
        )
        ticket = executor.submit(job)
        self.log(f"trial {trial.number}: probing {candidate.label}")
        return ticket, _InFlight(trial, candidate, ds_config, trial_dir, time.monotonic())

    @staticmethod
    def _probed_stages(study: optuna.Study, inflight: Iterable[_InFlight]) -> set[int]:
        """ZeRO stages with a probe that ran or is running (screened trials do not count)."""
        stages = {job.candidate.zero_stage for job in inflight}
        for trial in study.get_trials(deepcopy=False):
            attrs = trial.user_attrs
            if "probe_wall_s" in attrs and "candidate" in attrs and not is_duplicate(trial):
                stages.add(int(attrs["candidate"]["zero_stage"]))
        return stages

    def _early_stop_threshold(self, study: optuna.Study) -> float:
        """Samples/s below which a probe may stop early: the best so far less a margin
        (none for grid runs, which measure everything in full)."""
        settings = self.plan.settings
        if not settings.early_stop or settings.sampler == "grid":
            return 0.0
        from autotune.export import best_trial

        best = best_trial(study)
        return float(best.value) * (1.0 - EARLY_STOP_MARGIN) if best and best.value else 0.0

    def _record(self, study: optuna.Study, job: _InFlight, result: ProbeResult) -> None:
        limit = self.plan.config.vram_limit_bytes
        prediction = self._predictions.pop(job.trial.number, {})
        for key, value in prediction.items():
            job.trial.set_user_attr(key, value)
        if result.status in ("oom", "ok"):
            self._note_outcome(job.candidate, result.status, job.trial.number)
        if result.status == "ok" and prediction.get("predicted_raw_bytes"):
            # the uncorrected prediction is what calibration compares against
            raw = int(prediction["predicted_raw_bytes"])  # type: ignore[call-overload]
            self._calibration.add(job.candidate, raw, result.peak_bytes)
        record_result(
            study,
            job.trial,
            job.candidate,
            result,
            vram_limit_bytes=limit,
            ds_config=job.ds_config,
            trial_dir=str(job.trial_dir),
        )
        peak = f"peak {format_bytes(result.peak_bytes)} of {format_bytes(limit)}"
        if result.status == "ok" and result.stopped_early:
            outcome = (
                f"stopped early after {len(result.step_times_s)} step(s): "
                f"{result.samples_per_s:.1f} samples/s, clearly below the best so far"
            )
        elif result.status == "ok":
            outcome = (
                f"{result.samples_per_s:.1f} samples/s (±{100 * result.spread / 2:.0f}%), "
                f"{result.tokens_per_s:.0f} tokens/s, {peak}"
            )
        elif result.status == "oom":
            outcome = f"out of memory, infeasible ({result.error})"
        else:
            outcome = f"{result.status}: {result.error} (log: {job.trial_dir / 'probe.log'})"
        self.log(
            f"trial {job.trial.number}: {job.candidate.label} -> {outcome} [{result.wall_s:.0f} s]"
        )

    def _prepare_ops(self) -> None:
        from autotune.hardware import ensure_deepspeed_ops

        cpu_offload = any(
            c.offload_optimizer == "cpu" or c.offload_param == "cpu"
            for c in self.plan.space.candidates()
        )
        started = time.monotonic()
        ensure_deepspeed_ops(self.plan.hardware, cpu_offload=cpu_offload)
        if time.monotonic() - started > 5:
            self.log(
                f"built DeepSpeed ops in {time.monotonic() - started:.0f} s (cached from now on)"
            )

    def _finish(self, study: optuna.Study, summary: RunSummary) -> None:
        from autotune.export import best_trial, export

        best = best_trial(study)
        if best is None:
            self.log("no feasible trial yet: nothing exported")
            return
        summary.best_trial = best.number
        summary.best_label = best.user_attrs.get("label", "")
        summary.best_samples_per_s = float(best.value or 0.0)
        summary.best_tokens_per_s = float(best.user_attrs.get("tokens_per_s", 0.0))
        summary.best_peak_bytes = int(best.user_attrs.get("peak_bytes", 0))
        exported = export(study, self.plan.trials_dir / "best", trial_number=best.number)
        summary.export_path = exported.ds_config


def default_executor(plan: Plan) -> Executor:
    from autotune.executor import make_executor

    return make_executor(
        plan.settings.executor,
        total_devices=plan.settings.gpus,
        devices_per_probe=plan.config.gpus_per_trial,
        cuda=plan.hardware.accelerator == "cuda",
        cpu_count=plan.hardware.cpu_count,
        warm=plan.settings.warm_workers,
    )


def _median_wall_s(study: optuna.Study, *, full_only: bool) -> float:
    """Median wall time of the study's probes, of those that ran in full if ``full_only``.

    A warm worker's first probe pays the process group's start (~15 s of a ~3 s gpt-tiny
    probe here), and later probes do not: once a warm probe exists, cold ones are left out,
    or one cold start makes the next probe look too long to fit and ends the search early.
    """
    walls: list[tuple[float, bool]] = []
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        if "probe_wall_s" not in attrs or is_duplicate(trial):
            continue
        if full_only and (attrs.get("status") != "ok" or attrs.get("stopped_early")):
            continue
        walls.append((float(attrs["probe_wall_s"]), bool(attrs.get("probe_cold_start", False))))
    warm = [wall for wall, cold in walls if not cold]
    chosen = warm or [wall for wall, _ in walls]
    return statistics.median(chosen) if chosen else 0.0
