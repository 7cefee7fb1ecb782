"""A warm probe worker: one process group of ranks that probes candidates one after another.

A cold probe pays interpreter start, imports of torch, DeepSpeed and transformers, and
process-group set-up (most of a cold gpt-tiny trial's time: benchmarks/RESULTS.md,
"Per-trial overhead with warm workers") for a short run of timed steps. A
:class:`WarmWorker` keeps the ranks of ``autotune.probe.rank --serve INBOX``
running (:func:`~autotune.execution.launch.probe_command`) and posts each job as a file; the ranks
build, initialise, step and release one candidate after the other. A failed, hung or
cancelled probe kills the whole group (its ranks may be stuck in a collective, or hold a
broken device); the next job starts a fresh one. So isolation is the same as a cold
probe's where it matters, and the start-up cost is paid once per failure instead of once
per probe. Ranks that find an earlier candidate's memory still allocated when a job starts
report ``unclean`` without probing; the worker then restarts the group and probes the job
cold, so no probe measures another's leftovers.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from autotune.execution._held_folder import HeldFolder
from autotune.execution._script_outcome import again_cold
from autotune.execution.launch import (
    ProbeJob,
    group_shape,
    kill_process_group,
    prepare_trial_dir,
    probe_command,
    probe_env,
    read_reports,
    read_tail,
    remove_scratch,
    restore_child_signals,
    track_group,
    unclean_bytes,
)
from autotune.protocol import ProbeResult
from autotune.rank_outcome import aggregate

POLL_S = 0.05


class WarmWorker:
    """Runs jobs of one shape (ranks, threads, devices, working folder, the environment's
    TF32 override: :func:`~autotune.execution.launch.group_shape`) in a kept group."""

    def __init__(self, visible_devices: str | None = None) -> None:
        self.visible_devices = visible_devices
        self._folder = HeldFolder("autotune-worker-")  # removed by close, or by a later
        self._home = self._folder.path  # worker if this process is killed first
        self._process: subprocess.Popen[bytes] | None = None
        self._shape: tuple[object, ...] | None = None
        self._posted = 0
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self.script_warm = True  # a script's probes run warm until a warm run fails alone

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _start(self, job: ProbeJob) -> None:
        restore_child_signals()
        inbox = self._home / f"inbox-{time.monotonic_ns()}"
        inbox.mkdir()
        self._inbox, self._posted = inbox, 0
        self._log = open(self._home / "torchrun.log", "ab")  # noqa: SIM115 - lives with the group
        self._process = subprocess.Popen(
            probe_command(job, ["--serve", str(inbox)]),
            env=probe_env(job, self.visible_devices),
            cwd=job.cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        track_group(self._process.pid)
        self._shape = group_shape(job)

    def _post(self, message: dict[str, object]) -> None:
        self._posted += 1
        path = self._inbox / f"job-{self._posted:06d}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(message), encoding="utf-8")
        os.replace(tmp, path)  # ranks never read half a job

    def _kill(self) -> None:
        if self._process is not None:
            kill_process_group(self._process)
            self._process = None
            self._log.close()

    def run(self, job: ProbeJob) -> ProbeResult:
        """Probe one job; never raises for what the probe did. Its scratch folder is removed
        afterwards, whatever the outcome."""
        with self._lock:
            self._cancel.clear()
            try:
                shape = group_shape(job)
                cold_start = not self._alive() or shape != self._shape
                result, leaked = self._attempt(job, cold_start)
                if leaked:
                    # the group refused the job: probe it again in a fresh one
                    result, _ = self._attempt(job, cold_start=True)
                    result.leak_restart_bytes = leaked
                elif job.spec.script is not None and not cold_start and result.status == "error":
                    result = self._script_again_cold(job, result)
                return result
            finally:
                remove_scratch(job)

    def _attempt(self, job: ProbeJob, cold_start: bool) -> tuple[ProbeResult, int]:
        """Probe ``job`` once (in a fresh group if ``cold_start``); the result, and the bytes
        of earlier candidates the ranks found still allocated if they refused it (then the
        group is gone, and the result is not the job's)."""
        if cold_start:
            self._kill()
            self._start(job)
        assert self._process is not None
        spec_path = prepare_trial_dir(job)
        started = time.perf_counter()
        log_start = self._log.tell() if not self._log.closed else 0
        self._post({"spec": str(spec_path)})
        deadline = started + job.timeout_s
        timed_out = cancelled = False
        while True:
            reports = read_reports(job)
            done = len(reports) >= job.world_size
            failed = any(r.status != "ok" for r in reports)
            if done and not failed:
                break
            if self._process.poll() is not None:
                break
            if time.perf_counter() > deadline:
                timed_out = True
                break
            if self._cancel.is_set():
                cancelled = True
                break
            time.sleep(POLL_S)
        healthy = done and not failed and not timed_out and not cancelled
        exit_code: int | None = 0 if healthy else self._process.poll()
        if not healthy:
            # give the failing rank's peers a moment to be torn down by torchrun
            if failed and not timed_out:
                try:
                    exit_code = self._process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    exit_code = None
            self._kill()
        reports = read_reports(job)
        leaked = unclean_bytes(reports)
        wall_s = time.perf_counter() - started
        log_tail = read_tail(Path(job.trial_dir) / "probe.log")
        if not healthy:
            log_tail += _tail_since(self._home / "torchrun.log", log_start)
        result = aggregate(
            job.spec,
            reports,
            world_size=job.world_size,
            exit_code=exit_code,
            timed_out=timed_out,
            wall_s=wall_s,
            log_tail=log_tail,
        )
        result.cold_start = cold_start
        if cancelled:
            result = result.model_copy(
                update={"status": "error", "error": "cancelled: the run was interrupted"}
            )
        return result, 0 if cancelled or cold_start else leaked

    def _script_again_cold(self, job: ProbeJob, warm: ProbeResult) -> ProbeResult:
        """A script's warm run failed: probe it again cold (:func:`again_cold`); where that
        one measures, the script's later probes are cold launches."""
        if self._cancel.is_set():
            return warm
        cold = again_cold(warm, lambda: self._attempt(job, cold_start=True)[0])
        if cold.warm_fallback:
            self.script_warm = False
            self._kill()
        return cold

    def cancel(self) -> None:
        """Make a running :meth:`run` kill the group and return (thread-safe)."""
        self._cancel.set()

    def close(self) -> None:
        """Stop the group (asking first) and remove the inbox."""
        if self._alive():
            self._post({"stop": True})
            try:
                assert self._process is not None
                self._process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        self._kill()
        self._folder.remove()


def _tail_since(path: Path, offset: int, limit: int = 3000) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            return log.read()[-limit:].decode("utf-8", errors="replace")
    except OSError:
        return ""
