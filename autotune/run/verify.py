"""``autotune verify``: does a study's winner train the same as its reference?

The reference (:mod:`autotune.run._reference`) and the trial are trained from one seed on
one global batch for the same optimizer steps, as loss-parity runs of the probe's ranks
(``ProbeSpec.parity``, :mod:`autotune.probe._parity`), all in one launch: the reference
twice, then the trial. The comparison is :func:`autotune.study.loss_parity.compare`; the
check is stored in the study (:mod:`autotune.study.verification`).

The reference runs twice because a second run is the only evidence that the reference
itself is reproducible (the same weights, data order and kernels give the same losses):
without it, a difference could be the reference's own noise. For a built-in workload on
CPU ranks both runs are bitwise equal; on GPUs, kernels with atomics are not, and the
repeat shows by how much. A trial whose configuration is its reference's reuses the
repeat as its own run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune import events
from autotune.errors import SettingsError
from autotune.run._reference import Reference, choose_reference
from autotune.settings import DEFAULT_VERIFY_STEPS
from autotune.study import best, records, study_config
from autotune.study import verification as checks
from autotune.study.loss_parity import ComparedRun, ParityVerdict, compare

if TYPE_CHECKING:
    import optuna

    from autotune.candidate import Candidate
    from autotune.execution import ProbeJob
    from autotune.hardware import Hardware
    from autotune.protocol import ProbeResult
    from autotune.study import StudyConfig, TrialView

SEED = 0
MEMORY_MARGIN = 0.05  # the share of the limit a reference must leave free, as the search's


def verify(
    study: optuna.Study,
    *,
    trial: int | None = None,
    steps: int = DEFAULT_VERIFY_STEPS,
    emit: events.Emit = events.ignore,
    strict: bool = False,
) -> checks.Verification:
    """Check trial ``trial`` (the best by default) against its reference; store and return
    the check. ``strict`` (``run --verify-strict``): a trial whose check differs is set
    aside, never the best (a later check without it takes that back)."""
    started = time.monotonic()
    config = _checked_config(study, steps)
    trials = records.views(study)
    chosen = _chosen_trial(study, trials, trial)
    from autotune.hardware import detect
    from autotune.workloads import get_workload

    hardware = detect()
    workload = get_workload(config.workload)
    reference = choose_reference(
        chosen.candidate, config.base_config, _fits(workload, config, trials, hardware)
    )
    roles = ["reference", "reference repeat"]
    if reference.candidate != chosen.candidate:
        roles.append("winner")
    emit(
        events.VerificationStarted(
            chosen.number,
            chosen.label,
            reference.candidate.label,
            reference.reason,
            steps,
            len(roles),
        )
    )
    folder = Path(chosen.record.trial_dir).parent / f"verify-{chosen.number:04d}"
    jobs = _jobs(config, chosen, reference, roles, folder, steps, hardware, workload)
    _ensure_ops(hardware, jobs, emit)
    runs = _launch(roles, jobs, emit)
    return _record(study, chosen, reference, runs, steps, strict, started, emit)


def _record(
    study: optuna.Study,
    chosen: TrialView,
    reference: Reference,
    runs: list[checks.VerifiedRun],
    steps: int,
    strict: bool,
    started: float,
    emit: events.Emit,
) -> checks.Verification:
    """The runs compared, the check stored in the study and told."""
    verdict = _verdict(runs)
    check = checks.Verification(
        trial=chosen.number,
        label=chosen.label,
        reference_label=reference.candidate.label,
        reference_rule=reference.rule,
        reference_reason=reference.reason,
        steps=steps,
        seed=SEED,
        runs=runs,
        verdict=verdict,
        seconds=round(time.monotonic() - started, 1),
        set_aside=strict and verdict.verdict == "differs",
    )
    checks.store(study, check)
    emit(
        events.VerificationDone(
            chosen.number,
            verdict.text,
            verdict.max_relative_difference,
            verdict.tolerance_at_max,
            check.seconds,
            check.set_aside,
        )
    )
    return check


def _checked_config(study: optuna.Study, steps: int) -> StudyConfig:
    """The study's settings, where autotune verify can check its trials."""
    config = study_config(study)
    if config is None:
        raise SettingsError(f"study {study.study_name!r} was not made by autotune run")
    if config.script is not None:
        raise SettingsError(
            f"study {study.study_name!r} tunes a script: autotune verify checks built-in and "
            "file workloads only for now"
        )
    if steps < 1:
        raise SettingsError(f"--steps {steps}: give at least 1 optimizer step")
    return config


def _launch(roles: list[str], jobs: list[ProbeJob], emit: events.Emit) -> list[checks.VerifiedRun]:
    """Every run in one launch, reference first; a trial that is its own reference takes
    the repeat as its run."""
    from autotune.execution import launch_probes

    results = launch_probes(jobs)
    runs = [_run(role, job, result) for role, job, result in zip(roles, jobs, results, strict=True)]
    for run in runs:
        emit(events.VerificationRunDone(run.role, run.label, run.status, run.error, run.wall_s))
    if len(runs) == 2:
        runs.append(runs[1].model_copy(update={"role": "winner"}))
    return runs


def _chosen_trial(study: optuna.Study, trials: list[TrialView], number: int | None) -> TrialView:
    """The trial to verify: ``number``, or the best; it must have been measured in full."""
    if number is None:
        decided = best.of_study(study)
        if decided is None:
            raise SettingsError(
                f"study {study.study_name!r} has no feasible measured trial to verify yet; run "
                f"autotune run --study {study.study_name} first"
            )
        return trials[decided.trial]
    if not 0 <= number < len(trials):
        raise SettingsError(
            f"--trial {number}: study {study.study_name!r} has trials 0-{len(trials) - 1}"
            if trials
            else f"--trial {number}: study {study.study_name!r} has no trials"
        )
    chosen = trials[number]
    if not chosen.feasible:
        feasible = ", ".join(str(t.number) for t in records.ranked_feasible(trials)[:10])
        raise SettingsError(
            f"--trial {number} cannot be verified: it has no full measurement within the "
            f"limit (status {chosen.status!r}); feasible: {feasible or 'none'}"
        )
    return chosen


def _fits(workload: Any, config: StudyConfig, trials: list[TrialView], hardware: Hardware) -> Any:
    """The memory model's word on a candidate, with what the study's probes taught it."""
    from autotune.memory import Limits, MemoryScreen

    screen = MemoryScreen(
        workload,
        Limits(
            accelerator=config.accelerator,
            vram_limit_bytes=config.vram_limit_bytes,
            margin=MEMORY_MARGIN,
            host_ram_bytes=hardware.host_memory_bytes,
            ranks_per_node=config.gpus_per_trial,
        ),
        base_config=config.base_config,
    )
    for trial in records.evaluations(trials):
        screen.learn(trial)

    def fits(candidate: Candidate) -> bool:
        return screen.verdict(candidate).fits

    return fits


def _jobs(
    config: StudyConfig,
    chosen: TrialView,
    reference: Reference,
    roles: list[str],
    folder: Path,
    steps: int,
    hardware: Hardware,
    workload: Any,
) -> list[ProbeJob]:
    """One loss-parity job per role, in its own folder under ``folder``."""
    from autotune.backends import DEFAULT_BACKEND, get_backend
    from autotune.execution import ProbeJob
    from autotune.protocol import ParityRun, ProbeSpec
    from autotune.run._dispatch import workload_folders
    from autotune.run._plan import steps_timeout_s

    backend = get_backend(DEFAULT_BACKEND)
    fallback = backend.uses_fallback_optimizer(chosen.record.ds_config or {})
    jobs = []
    for role in roles:
        candidate = chosen.candidate if role == "winner" else reference.candidate
        ds_config = backend.render_config(candidate, config.base_config, nvme_path=config.nvme_path)
        if fallback:
            ds_config = backend.with_fallback_optimizer(ds_config)
        spec = ProbeSpec(
            workload=config.workload,
            candidate=candidate,
            ds_config=ds_config,
            accelerator=config.accelerator,  # type: ignore[arg-type]
            vram_limit_bytes=config.vram_limit_bytes,
            device_memory_bytes=hardware.device_memory_bytes,
            float32_matmul_precision=config.float32_matmul_precision,  # type: ignore[arg-type]
            parity=ParityRun(steps=steps, seed=SEED),
        )
        jobs.append(
            ProbeJob(
                spec=spec,
                trial_dir=str(folder / role.replace(" ", "-")),
                world_size=candidate.data_parallel_size,
                timeout_s=steps_timeout_s(
                    workload,
                    config.accelerator,
                    config.threads_per_rank,
                    candidate.train_batch_size,
                    candidate.data_parallel_size,
                    steps,
                ),
                threads_per_rank=config.threads_per_rank,
                cwd=str(Path.cwd()),
                python_path=workload_folders(config.workload),
            )
        )
    return jobs


def _ensure_ops(hardware: Hardware, jobs: list[ProbeJob], emit: events.Emit) -> None:
    """The backend's ops the runs step with, built before they start (cached after)."""
    from autotune.backends import DEFAULT_BACKEND, get_backend

    targets = {
        device
        for job in jobs
        for device in (job.spec.candidate.offload_optimizer, job.spec.candidate.offload_param)
        if device != "none"
    }
    get_backend(DEFAULT_BACKEND).ensure_ops(hardware, offload_targets=targets, emit=emit)


def _run(role: str, job: ProbeJob, result: ProbeResult) -> checks.VerifiedRun:
    return checks.VerifiedRun(
        role=role,  # type: ignore[arg-type]
        label=job.spec.candidate.label,
        candidate=job.spec.candidate,
        status=result.status,
        error=result.error,
        wall_s=round(result.wall_s, 1),
        folder=job.trial_dir,
        trace=result.loss_trace,
    )


def _verdict(runs: list[checks.VerifiedRun]) -> ParityVerdict:
    """The comparison of the runs; "cannot judge" where one did not finish."""
    failed = next((r for r in runs if r.status != "ok" or r.trace is None), None)
    precision = runs[-1].candidate.precision
    if failed is not None:
        return ParityVerdict(
            verdict="cannot judge",
            text=f"cannot judge: the {failed.role} run ended {failed.status}: {failed.error} "
            f"(log: {failed.folder}/probe.log)",
            precision=precision,
        )
    compared = [ComparedRun(candidate=r.candidate, trace=r.trace) for r in runs]  # type: ignore[arg-type]
    reference, repeat, winner = compared
    return compare(reference, winner, repeat=repeat)
