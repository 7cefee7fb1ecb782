"""The ask/tell loop: the driver process, the only writer of the study.

Optuna proposes, the bound space turns a trial into a :class:`Candidate`, a candidate the
study already evaluated is recorded as a duplicate (never probed twice), and new ones go to
the executor while budget and slots remain. Each result is told to Optuna as soon as it
arrives, so the sampler always sees the freshest data. When the run ends the best feasible
trial is exported to ``trials/<study>/best/``.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from autotune.errors import StorageError
from autotune.memory import Calibration
from autotune.settings import format_bytes, format_duration
from autotune.study import (
    METRIC,
    is_duplicate,
    open_storage,
    record_duplicate,
    record_result,
    record_running_duplicate,
    study_config,
)

if TYPE_CHECKING:
    import optuna

    from autotune.candidate import Candidate
    from autotune.executor import Executor
    from autotune.memory import MemoryModel
    from autotune.plan import Plan
    from autotune.protocol import ProbeResult

# After this many proposals in a row of already-evaluated candidates, the tuner hands the
# sampler an unseen candidate (enqueued), so small spaces finish instead of spinning.
MAX_DUPLICATES_IN_A_ROW = 3
POLL_S = 1.0


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
    ) -> None:
        self.plan = plan
        self.log = log
        self._executor_factory = executor_factory or default_executor
        self._fault = fault
        self._rng = random.Random(plan.settings.seed)
        self._calibration = Calibration()
        self._memory: MemoryModel | None = None
        self._predictions: dict[int, dict[str, object]] = {}

    # -- study -------------------------------------------------------------------------
    def open_study(self) -> optuna.Study:
        import warnings

        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        storage = open_storage(self.plan.settings.storage_url)
        sampler = optuna.samplers.TPESampler(seed=self.plan.settings.seed)
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
            study.set_metric_names([METRIC])
        elif stored != self.plan.config:
            diffs = "; ".join(stored.differences(self.plan.config))
            raise StorageError(
                f"study {self.plan.study_name!r} was started with other settings ({diffs}); "
                "continue it with its settings, or pass --study NEW_NAME to start a new study"
            )
        return study

    def _known_candidates(self, study: optuna.Study) -> dict[str, optuna.trial.FrozenTrial]:
        """Evaluated candidates by key; RUNNING trials of a dead driver become FAIL and are
        enqueued to be probed again."""
        from optuna.trial import TrialState

        known: dict[str, optuna.trial.FrozenTrial] = {}
        for trial in study.get_trials(deepcopy=False):
            key = trial.user_attrs.get("candidate_key")
            if key is None or is_duplicate(trial):
                continue
            if trial.state == TrialState.RUNNING:
                study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
                study._storage.set_trial_user_attr(trial._trial_id, "status", "interrupted")
                self.log(f"trial {trial.number} was left running by a stopped driver: retrying")
                study.enqueue_trial(dict(trial.params))
                continue
            if trial.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL):
                known.setdefault(key, trial)
        return known

    def _probe_estimate_s(self, study: optuna.Study) -> float:
        walls = [
            t.user_attrs["probe_wall_s"]
            for t in study.get_trials(deepcopy=False)
            if "probe_wall_s" in t.user_attrs and not is_duplicate(t)
        ]
        return statistics.median(walls) if walls else 0.0

    # -- loop --------------------------------------------------------------------------
    def run(self) -> RunSummary:
        plan = self.plan
        settings = plan.settings
        started = time.monotonic()
        deadline = started + settings.budget_s
        study = self.open_study()
        known = self._known_candidates(study)
        self._calibrate_from(study)
        all_candidates = {c.key: c for c in plan.space.candidates()}
        summary = RunSummary(
            study_name=plan.study_name, vram_limit_bytes=plan.config.vram_limit_bytes
        )
        self.log(
            f"study {plan.study_name!r}: {len(known)} candidate(s) evaluated before, "
            f"{len(all_candidates)} valid in the space; budget {format_duration(settings.budget_s)}"
        )
        self._prepare_ops()
        executor = self._executor_factory(plan)
        inflight: dict[int, _InFlight] = {}
        estimate_s = self._probe_estimate_s(study)
        duplicates_in_a_row = 0
        stop_reason = ""
        try:
            while True:
                while len(inflight) < executor.capacity and not stop_reason:
                    if settings.max_trials is not None and summary.probes >= settings.max_trials:
                        stop_reason = f"--max-trials {settings.max_trials} reached"
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or remaining < estimate_s:
                        stop_reason = "budget spent"
                        break
                    running = {job.candidate.key: job.trial.number for job in inflight.values()}
                    unseen = [k for k in all_candidates if k not in known and k not in running]
                    if not unseen:
                        stop_reason = "every valid candidate has been evaluated"
                        break
                    if duplicates_in_a_row >= MAX_DUPLICATES_IN_A_ROW:
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
                    ticket, job = self._submit(executor, study, trial, candidate)
                    inflight[ticket] = job
                    summary.probes += 1
                if not inflight:
                    break
                for ticket, result in executor.wait(POLL_S):
                    job = inflight.pop(ticket)
                    self._record(study, job, result)
                    known[job.candidate.key] = study.get_trials(deepcopy=False)[job.trial.number]
                    estimate_s = self._probe_estimate_s(study)
        except KeyboardInterrupt:
            stop_reason = "interrupted"
            executor.cancel_all()
            from optuna.trial import TrialState

            for job in inflight.values():
                job.trial.set_user_attr("status", "interrupted")
                study.tell(job.trial, state=TrialState.FAIL)
            self.log(
                f"interrupted: {len(inflight)} running probe(s) stopped; continue with "
                f"autotune run --study {plan.study_name} (same flags)"
            )
        finally:
            executor.close()
        summary.stop_reason = stop_reason
        summary.elapsed_s = time.monotonic() - started
        self._finish(study, summary)
        return summary

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

        model = self._memory_model()
        if model is None:
            return False
        plan = self.plan
        estimate = model.predict(candidate)
        predicted = estimate.tracked_bytes(plan.hardware.accelerator)
        host = estimate.host_bytes * plan.config.gpus_per_trial
        limit = plan.config.vram_limit_bytes
        threshold = limit * (1.0 - plan.settings.memory_margin)
        host_ram = plan.settings.host_ram_bytes or plan.hardware.host_memory_bytes
        raw = int(predicted / estimate.correction)
        attrs = {
            "predicted_peak_bytes": predicted,
            "predicted_raw_bytes": raw,
            "predicted_host_bytes": estimate.host_bytes,
            "predicted_phase": estimate.phase,
            "memory_correction": estimate.correction,
        }
        self._predictions[trial.number] = attrs
        reason = ""
        if predicted > threshold:
            reason = (
                f"predicted peak {format_bytes(predicted)} per rank exceeds the limit "
                f"{format_bytes(limit)} less the {100 * plan.settings.memory_margin:.0f}% margin"
            )
            over = predicted - threshold
        elif plan.hardware.accelerator == "cuda" and host > host_ram:
            reason = (
                f"predicted host memory {format_bytes(host)} per node exceeds --host-ram "
                f"{format_bytes(host_ram)}"
            )
            over = host - host_ram
        if not reason:
            return False
        record_pruned(
            study,
            trial,
            candidate,
            pruned_by="memory-model",
            reason=reason,
            over_bytes=over,
            attrs={**attrs, "vram_limit_bytes": limit},
        )
        self.log(f"trial {trial.number}: {candidate.label} -> infeasible, not probed: {reason}")
        return True

    def _submit(
        self, executor: Executor, study: optuna.Study, trial: optuna.Trial, candidate: Candidate
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
            timed_steps=settings.timed_steps,
            tokens_per_sample=plan.workload.tokens_per_sample,
            fault=self._fault,
        )
        job = ProbeJob(
            spec=spec,
            trial_dir=str(trial_dir),
            world_size=candidate.data_parallel_size,
            timeout_s=settings.probe_timeout_s,
            threads_per_rank=plan.config.threads_per_rank,
            cwd=str(Path.cwd()),
        )
        ticket = executor.submit(job)
        self.log(f"trial {trial.number}: probing {candidate.label}")
        return ticket, _InFlight(trial, candidate, ds_config, trial_dir, time.monotonic())

    def _record(self, study: optuna.Study, job: _InFlight, result: ProbeResult) -> None:
        limit = self.plan.config.vram_limit_bytes
        prediction = self._predictions.pop(job.trial.number, {})
        for key, value in prediction.items():
            job.trial.set_user_attr(key, value)
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
        if result.status == "ok":
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
