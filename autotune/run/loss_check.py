"""``autotune verify``: does a study's winner train the same as its reference?

The reference (:mod:`autotune.run._reference`) and the trial are trained from one seed on
one global batch for the same optimizer steps, as loss runs of the probe's ranks
(``ProbeSpec.loss_run``, :mod:`autotune.probe._loss_run`), all in one launch: the reference
twice, then the trial. The comparison is :func:`autotune.study.loss_comparison.compare`; the
check is stored in the study (:mod:`autotune.study.loss_checks`).

The reference runs twice because a second run is the only evidence that the reference
itself is reproducible (the same weights, data order and kernels give the same losses):
without it, a difference could be the reference's own noise. For a built-in workload on
CPU ranks both runs are bitwise equal; on GPUs, kernels with atomics are not, and the
repeat shows by how much. A trial whose configuration is its reference's reuses the
repeat as its own run.

A script study's runs are the user's script itself (``autotune.probe.script_rank`` with
the loss run, :mod:`autotune.probe._script_loss_run`), one launch each: its reference is
rule 1 with the config the script names on its command line, where it names one.

A ``cancel`` event set (the first Ctrl-C) stops the runs; nothing is stored and
:class:`LossCheckInterruptedError` is raised.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune import events
from autotune.errors import AutotuneError, SettingsError
from autotune.run._reference import Reference, choose_reference
from autotune.settings import DEFAULT_VERIFY_STEPS
from autotune.study import best, records, study_config
from autotune.study import loss_checks as checks
from autotune.study.loss_comparison import ComparedRun, LossComparison, compare

if TYPE_CHECKING:
    import optuna

    from autotune.candidate import Candidate
    from autotune.execution import ProbeJob
    from autotune.hardware import Hardware
    from autotune.protocol import ProbeResult, ScriptRun
    from autotune.study import StudyConfig, TrialView

SEED = 0


class LossCheckInterruptedError(AutotuneError):
    """The check was stopped (Ctrl-C) before its runs ended: nothing was stored."""

    exit_code = 130


def check_loss(
    study: optuna.Study,
    *,
    trial: int | None = None,
    steps: int = DEFAULT_VERIFY_STEPS,
    emit: events.Emit = events.ignore,
    strict: bool = False,
    cancel: threading.Event | None = None,
) -> checks.LossCheck:
    """Check trial ``trial`` (the best by default) against its reference; store and return
    the check. ``strict`` (``run --verify strict``): a trial whose check differs is set
    aside, never the best (a later check without it takes that back). ``cancel`` set:
    the runs are stopped and :class:`LossCheckInterruptedError` raised, nothing stored."""
    started = time.monotonic()
    config = _checked_config(study, steps)
    trials = records.views(study)
    chosen = _chosen_trial(study, trials, trial)
    from autotune.hardware import detect

    hardware = detect()
    workload = _workload(config, chosen.candidate)
    base, base_source = _base_config(config, chosen)
    reference = choose_reference(
        chosen.candidate, base, _fits(workload, config, trials, hardware), base_source
    )
    roles = ["reference", "reference repeat"]
    if reference.candidate != chosen.candidate:
        roles.append("winner")
    emit(
        events.LossCheckStarted(
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
    runs = _launch(roles, jobs, emit, cancel)
    if cancel is not None and cancel.is_set():
        emit(events.LossCheckInterrupted(chosen.number))
        raise LossCheckInterruptedError(
            f"the loss check of trial {chosen.number} was interrupted: nothing recorded; run "
            f"autotune verify --study {study.study_name} --trial {chosen.number} to check it"
        )
    return _record(study, chosen, reference, runs, steps, strict, started, emit)


def _record(
    study: optuna.Study,
    chosen: TrialView,
    reference: Reference,
    runs: list[checks.LossCheckRun],
    steps: int,
    strict: bool,
    started: float,
    emit: events.Emit,
) -> checks.LossCheck:
    """The runs compared, the check stored in the study and told."""
    verdict = _verdict(runs)
    check = checks.LossCheck(
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
        events.LossCheckDone(
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
    if steps < 1:
        raise SettingsError(f"--steps {steps}: give at least 1 optimizer step")
    return config


def _base_config(config: StudyConfig, chosen: TrialView) -> tuple[dict[str, Any] | None, str]:
    """The user's base config and where it came from: ``--base-config`` (for a script, the
    config file it names), else the config a script built in code, as its probe's rank 0
    wrote it down (:data:`~autotune.protocol.SCRIPT_CONFIG_FILE`)."""
    if config.base_config is not None or config.script is None:
        return config.base_config, "your base config"
    import json

    from autotune.protocol import SCRIPT_CONFIG_FILE

    try:
        passed = json.loads((Path(chosen.record.trial_dir) / SCRIPT_CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None, ""
    return passed, f"the config {config.script.name} passes to deepspeed.initialize"


def _workload(config: StudyConfig, chosen: Candidate) -> Any:
    """The study's workload, or its script where a workload is expected."""
    if config.script is not None:
        from autotune.run._script_inputs import ScriptWorkload

        return ScriptWorkload(config.script, chosen.train_batch_size)
    from autotune.workloads import get_workload

    return get_workload(config.workload)


def _launch(
    roles: list[str], jobs: list[ProbeJob], emit: events.Emit, cancel: threading.Event | None
) -> list[checks.LossCheckRun]:
    """Every run in one launch (a script's: one launch each), reference first; a trial
    that is its own reference takes the repeat as its run."""
    from autotune.execution import launch_probes

    if jobs[0].spec.script is None:
        results = launch_probes(jobs, cancel=cancel)
    else:
        results = []
        for job in jobs:
            if cancel is not None and cancel.is_set():
                break
            results += launch_probes([job], cancel=cancel)
    if cancel is not None and cancel.is_set():
        return []
    runs = [_run(role, job, result) for role, job, result in zip(roles, jobs, results, strict=True)]
    for run in runs:
        emit(events.LossCheckRunDone(run.role, run.label, run.status, run.error, run.wall_s))
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
    from autotune.run._study_screen import study_memory_screen

    screen = study_memory_screen(
        workload,
        config,
        trials,
        host_ram_bytes=hardware.host_memory_bytes,
        ranks_per_node=config.gpus_per_trial,
    )

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
    """One loss-check job per role, in its own folder under ``folder``."""
    from autotune.backends import get_backend
    from autotune.execution import ProbeJob
    from autotune.protocol import LossRun, ProbeSpec
    from autotune.run._dispatch import workload_folders

    fallback = get_backend(chosen.candidate.backend).uses_fallback_optimizer(
        chosen.record.backend_config or {}
    )
    jobs = []
    for role in roles:
        candidate = chosen.candidate if role == "winner" else reference.candidate
        backend = get_backend(candidate.backend)
        trial_dir = folder / role.replace(" ", "-")
        backend_config = backend.render_config(
            candidate, config.base_config, nvme_path=config.nvme_path
        )
        if fallback:
            backend_config = backend.with_fallback_optimizer(backend_config)
        script, cwd = None, str(Path.cwd())
        if config.script is not None:
            backend_config = backend.config_for_script(backend_config, config.script)
            script = _script_run(config, candidate, trial_dir, fallback)
            cwd = config.script.cwd
        spec = ProbeSpec(
            workload=config.workload,
            candidate=candidate,
            backend_config=backend_config,
            accelerator=config.accelerator,  # type: ignore[arg-type]
            vram_limit_bytes=config.vram_limit_bytes,
            device_memory_bytes=hardware.device_memory_bytes,
            float32_matmul_precision=config.float32_matmul_precision,  # type: ignore[arg-type]
            loss_run=LossRun(steps=steps, seed=SEED),
            script=script,
        )
        jobs.append(
            ProbeJob(
                spec=spec,
                trial_dir=str(trial_dir),
                world_size=candidate.data_parallel_size,
                timeout_s=_timeout_s(config, workload, candidate, steps),
                threads_per_rank=config.threads_per_rank,
                cwd=cwd,
                python_path=[] if script is not None else workload_folders(config.workload),
            )
        )
    return jobs


def _script_run(
    config: StudyConfig, candidate: Candidate, trial_dir: Path, torch_adam: bool
) -> ScriptRun:
    """The study's script with ``candidate``'s arguments, its config in ``trial_dir``."""
    from autotune.protocol import ScriptRun

    assert config.script is not None
    return ScriptRun(
        path=config.script.path,
        argv=config.script.argv(
            candidate, str(trial_dir / "ds_config.json"), cpu=config.accelerator == "cpu"
        ),
        nvme_path=config.nvme_path,
        torch_adam=torch_adam,
    )


def _timeout_s(config: StudyConfig, workload: Any, candidate: Candidate, steps: int) -> float:
    """A run's hard limit: a script's as its probes' (its start and steps are its own), a
    workload's from its size (:func:`~autotune.run._resolved_run.steps_timeout_s`)."""
    if config.script is not None:
        from autotune.run._script_inputs import SCRIPT_PROBE_TIMEOUT_S

        return SCRIPT_PROBE_TIMEOUT_S
    from autotune.run._resolved_run import steps_timeout_s

    return steps_timeout_s(
        workload,
        config.accelerator,
        config.threads_per_rank,
        candidate.train_batch_size,
        candidate.data_parallel_size,
        steps,
    )


def _ensure_ops(hardware: Hardware, jobs: list[ProbeJob], emit: events.Emit) -> None:
    """The backend's ops the runs step with, built before they start (cached after)."""
    from autotune.backends import get_backend

    targets = {
        device
        for job in jobs
        for device in (job.spec.candidate.offload_optimizer, job.spec.candidate.offload_param)
        if device != "none"
    }
    for name in dict.fromkeys(job.spec.candidate.backend for job in jobs):
        get_backend(name).ensure_ops(hardware, offload_targets=targets, emit=emit)


def _run(role: str, job: ProbeJob, result: ProbeResult) -> checks.LossCheckRun:
    return checks.LossCheckRun(
        role=role,  # type: ignore[arg-type]
        label=job.spec.candidate.label,
        candidate=job.spec.candidate,
        status=result.status,
        error=result.error,
        wall_s=round(result.wall_s, 1),
        folder=job.trial_dir,
        trace=result.loss_trace,
    )


def _verdict(runs: list[checks.LossCheckRun]) -> LossComparison:
    """The comparison of the runs; "cannot judge" where one did not finish."""
    failed = next((r for r in runs if r.status != "ok" or r.trace is None), None)
    precision = runs[-1].candidate.precision
    if failed is not None:
        return LossComparison(
            verdict="cannot judge",
            text=f"cannot judge: the {failed.role} run ended {failed.status}: {failed.error} "
            f"(log: {failed.folder}/probe.log)",
            precision=precision,
        )
    compared = [ComparedRun(candidate=r.candidate, trace=r.trace) for r in runs]  # type: ignore[arg-type]
    reference, repeat, winner = compared
    return compare(reference, winner, repeat=repeat)
