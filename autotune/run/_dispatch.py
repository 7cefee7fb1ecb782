"""Probes in flight on the executor's slots: build each probe's job, submit, collect,
cancel.

A probe is a search trial's (an Optuna trial, whose record is written as it starts) or a
confirmation re-probe of an evaluated trial (no trial of its own: its result joins the
confirmation verdict). Either way the job is the same: the candidate's DeepSpeed config over
the study's base config, the probe's length and early-stop threshold, the memory limit, its
own folder under ``trials/<study>/`` and, for NVMe offload, its own swap folder (removed
after the probe).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.candidate import Candidate
from autotune.study import TrialRecord, records

if TYPE_CHECKING:
    import optuna

    from autotune.execution import Executor, ProbeJob
    from autotune.protocol import ProbeResult, ScriptRun
    from autotune.run._resolved_run import ResolvedRun
    from autotune.script_config import ScriptConfig


@dataclass(eq=False)  # one probe is itself: compared and hashed by identity
class InFlight:
    """A probe submitted and not yet collected."""

    candidate: Candidate
    record: TrialRecord  # what was known before the probe (written on the trial)
    trial: optuna.Trial | None  # None: a confirmation re-probe
    started: float

    @property
    def number(self) -> int | None:
        return None if self.trial is None else self.trial.number


class Dispatcher:
    """The executor's slots, and the probes running on them."""

    def __init__(self, resolved: ResolvedRun, executor: Executor, *, fault: str = "none") -> None:
        self.resolved = resolved
        self.executor = executor
        self._fault = fault
        self._inflight: dict[int, InFlight] = {}
        self._seen: dict[int, tuple[str, int]] = {}  # the last progress read of each probe

    @property
    def free_slots(self) -> int:
        return self.executor.capacity - len(self._inflight)

    @property
    def inflight(self) -> list[InFlight]:
        return list(self._inflight.values())

    def submit(
        self,
        candidate: Candidate,
        record: TrialRecord,
        *,
        trial: optuna.Trial | None,
        folder: str,
        stop_below_samples_per_s: float = 0.0,
    ) -> InFlight:
        """Start a probe of ``candidate`` in ``trials/<study>/<folder>``; a trial's record
        (``record`` with the config and folder) is written before the probe starts."""
        trial_dir = self.resolved.trials_dir / folder
        job = self.job(candidate, trial_dir, stop_below_samples_per_s)
        record = record.model_copy(
            update={"backend_config": job.spec.backend_config, "trial_dir": str(trial_dir)}
        )
        if trial is not None:
            records.write(trial, record)
        ticket = self.executor.submit(job)
        job_state = InFlight(candidate, record, trial, time.monotonic())
        self._inflight[ticket] = job_state
        return job_state

    def collect(self, timeout_s: float) -> list[tuple[InFlight, ProbeResult]]:
        """Results that arrive within ``timeout_s``, in completion order."""
        done = [
            (self._inflight.pop(ticket), result) for ticket, result in self.executor.wait(timeout_s)
        ]
        for job, _ in done:
            self._seen.pop(id(job), None)
        return done

    def progress(self) -> dict[InFlight, tuple[str, int]]:
        """(phase, optimizer steps) of each probe in flight whose rank 0 reported a step
        since the last call."""
        from autotune.probe import PROGRESS_FILE

        changed = {}
        for job in self._inflight.values():
            try:
                raw = json.loads((Path(job.record.trial_dir) / PROGRESS_FILE).read_text())
            except (OSError, ValueError):
                continue
            reading = (str(raw.get("phase", "")), int(raw.get("steps", 0)))
            if self._seen.get(id(job)) != reading:
                self._seen[id(job)] = reading
                changed[job] = reading
        return changed

    def job(self, candidate: Candidate, trial_dir: Path, stop_below: float) -> ProbeJob:
        from autotune.execution import ProbeJob
        from autotune.protocol import ProbeSpec

        resolved = self.resolved
        settings = resolved.settings
        nvme_dir = _probe_nvme_dir(resolved, candidate, trial_dir)
        backend_config = resolved.backend_config(candidate, nvme_dir)
        script, cwd = None, str(Path.cwd())
        if resolved.config.script is not None:
            from autotune.backends import get_backend

            backend_config = get_backend(candidate.backend).config_for_script(
                backend_config, resolved.config.script
            )
            script = _script_run(resolved, resolved.config.script, candidate, trial_dir, nvme_dir)
            cwd = resolved.config.script.cwd
        spec = ProbeSpec(
            workload=resolved.workload_ref,
            candidate=candidate,
            backend_config=backend_config,
            accelerator=resolved.hardware.accelerator,
            vram_limit_bytes=resolved.config.vram_limit_bytes,
            device_memory_bytes=resolved.hardware.device_memory_bytes,
            warmup_steps=settings.probe.warmup_steps,
            max_warmup_steps=settings.probe.warmup_steps + 4,
            timed_steps=settings.probe.timed_steps,
            max_timed_steps=max(settings.probe.max_timed_steps, settings.probe.timed_steps),
            stop_below_samples_per_s=stop_below,
            tokens_per_sample=resolved.workload.tokens_per_sample,
            float32_matmul_precision=resolved.config.float32_matmul_precision,  # type: ignore[arg-type]
            fault=self._fault,  # type: ignore[arg-type]
            script=script,
        )
        return ProbeJob(
            spec=spec,
            trial_dir=str(trial_dir),
            world_size=candidate.data_parallel_size,
            timeout_s=resolved.probe_timeout_s,
            threads_per_rank=resolved.config.threads_per_rank,
            cwd=cwd,
            python_path=workload_folders(resolved.workload_ref),
            scratch_dir=nvme_dir,  # removed after the probe: swap files fill a disk
        )

    def cancel_all(self) -> list[InFlight]:
        """Stop every running probe (whole process groups); return what was running."""
        stopped = self.inflight
        if stopped:
            self.executor.cancel_all()
        self._inflight.clear()
        return stopped

    def close(self) -> None:
        self.executor.close()


def _probe_nvme_dir(resolved: ResolvedRun, candidate: Candidate, trial_dir: Path) -> str | None:
    """The probe's own NVMe swap folder, if it offloads to NVMe: concurrent probes must not
    share DeepSpeed's swap folders."""
    if resolved.config.nvme_path and "nvme" in (
        candidate.offload_optimizer,
        candidate.offload_param,
    ):
        return str(
            Path(resolved.config.nvme_path) / "autotune" / resolved.study_name / trial_dir.name
        )
    return None


def _script_run(
    resolved: ResolvedRun,
    script: ScriptConfig,
    candidate: Candidate,
    trial_dir: Path,
    nvme_dir: str | None,
) -> ScriptRun:
    """How a script probe runs the script's own program: with the candidate's arguments,
    which name the config the launch writes into the trial folder."""
    from autotune.protocol import ScriptRun

    return ScriptRun(
        path=script.path,
        argv=script.argv(
            candidate,
            str(trial_dir / "ds_config.json"),
            cpu=resolved.hardware.accelerator == "cpu",
        ),
        nvme_path=nvme_dir or resolved.config.nvme_path,
        torch_adam=resolved.torch_adam,
    )


def workload_folders(ref: str) -> list[str]:
    """The folder of a workload given as ``path/to/file.py:function`` (its sibling modules
    import from there), else none: a ``package.module`` is imported as the driver imports
    it, from the environment."""
    location, sep, _ = ref.rpartition(":")
    if sep and (location.endswith(".py") or "/" in location):
        return [str(Path(location).resolve().parent)]
    return []
