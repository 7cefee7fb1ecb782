"""Where probes run: GPU slots, and the subprocess that is one probe.

:func:`launch_probe` starts ``torchrun --standalone -m autotune.probe`` in its own process
group under a hard timeout, and turns whatever happened into a
:class:`~autotune.protocol.ProbeResult`. Two executors run it:

- :class:`RayExecutor` (default): each probe is a Ray core task that holds K GPUs (or K
  CPU-rank slots on a machine without GPUs); this is the only module that imports ray.
- :class:`LocalExecutor` (``--executor local``): the same launch from driver threads, for
  machines without Ray (Ray's wheel does not travel to every GPU box).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from autotune.errors import ExecutorError
from autotune.hardware import torch_extensions_dir
from autotune.protocol import ProbeResult, ProbeSpec, RankReport, aggregate

LOG_TAIL_CHARS = 4000
KILL_GRACE_S = 5.0
# Ray resource that gates CPU-rank probes on machines without GPUs.
CPU_RANK_RESOURCE = "autotune_cpu_rank"


class ProbeJob(BaseModel):
    """A probe plus where and how to launch it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: ProbeSpec
    trial_dir: str = Field(description="Absolute folder for spec, rank reports and the log.")
    world_size: int = Field(description="Ranks (devices) of the probe.")
    timeout_s: float = Field(description="Hard limit, launch to exit.")
    threads_per_rank: int = Field(description="OMP/MKL threads of each rank, as in production.")
    cwd: str = Field(description="Working directory (the driver's), for user workload paths.")


def probe_env(job: ProbeJob, visible_devices: str | None) -> dict[str, str]:
    """The environment of a probe: production threading, the accelerator, quiet libraries."""
    env = dict(os.environ)
    threads = str(job.threads_per_rank)
    # A Ray task exports OMP_NUM_THREADS=<its num_cpus>; the probe must instead run with the
    # threading production has, or its throughput is not the production throughput.
    env.update(
        OMP_NUM_THREADS=threads,
        MKL_NUM_THREADS=threads,
        PYTHONUNBUFFERED="1",
        TRANSFORMERS_VERBOSITY="error",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [job.cwd, env.get("PYTHONPATH")]))
    env["TORCH_EXTENSIONS_DIR"] = torch_extensions_dir()
    if job.spec.accelerator == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        # Without LOCAL_SIZE DeepSpeed's CPU backend skips its shared-memory all-reduce, which
        # only inference uses and which leaves 69 MB per rank in /dev/shm when a probe is
        # killed; training collectives go through gloo either way.
        env.pop("LOCAL_SIZE", None)
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices
    return env


# Ray workers ignore SIGCHLD and block SIGINT; children inherit both across exec, and then
# torchrun cannot reap its ranks (py-cpuinfo's helper process, spawned inside
# deepspeed.initialize, hung forever that way). This prelude restores the defaults, then
# execs torchrun.
_CLEAN_SIGNALS_EXEC = (
    "import os, signal, sys; "
    "signal.signal(signal.SIGCHLD, signal.SIG_DFL); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.pthread_sigmask(signal.SIG_SETMASK, []); "
    "os.execv(sys.executable, [sys.executable] + sys.argv[1:])"
)


def restore_child_signals() -> None:
    """Let this process reap its children again.

    A process that runs Ray (the driver after ``ray.init``, every Ray worker) has SIGCHLD
    ignored at the OS level, where Python's ``signal.getsignal`` does not see it; its
    children inherit that. ``Popen.wait`` then gets ECHILD and reports exit code 0, and
    py-cpuinfo's helper (run inside DeepSpeed's op loader) hangs. Only the main thread may
    set handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def probe_command(job: ProbeJob, spec_paths: list[Path]) -> list[str]:
    specs = [arg for path in spec_paths for arg in ("--spec", str(path))]
    return [
        sys.executable,
        "-c",
        _CLEAN_SIGNALS_EXEC,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={job.world_size}",
        "--max-restarts=0",
        "-m",
        "autotune.probe",
        *specs,
    ]


def launch_probe(job: ProbeJob, visible_devices: str | None = None) -> ProbeResult:
    """Run one probe to completion or timeout; never raises for what the probe did."""
    return launch_probes([job], visible_devices)[0]


def launch_probes(jobs: list[ProbeJob], visible_devices: str | None = None) -> list[ProbeResult]:
    """Probe several candidates in one torchrun launch, one after the other.

    The ranks pay interpreter start, imports and process-group set-up once for all of them.
    The jobs must share world size, working directory and threads; the launch's timeout is
    the sum of theirs. If a candidate fails, the ranks exit and later candidates are
    reported as not probed.
    """
    first = jobs[0]
    if any(
        (j.world_size, j.cwd, j.threads_per_rank)
        != (first.world_size, first.cwd, first.threads_per_rank)
        for j in jobs
    ):
        raise ValueError("jobs launched together must share world size, cwd and threads")
    restore_child_signals()
    spec_paths = []
    for job in jobs:
        trial_dir = Path(job.trial_dir)
        trial_dir.mkdir(parents=True, exist_ok=True)
        for stale in trial_dir.glob("rank-*.json"):
            stale.unlink()
        spec_path = trial_dir / "spec.json"
        spec_path.write_text(job.spec.model_dump_json(indent=1), encoding="utf-8")
        (trial_dir / "ds_config.json").write_text(_json_dump(job.spec.ds_config), encoding="utf-8")
        spec_paths.append(spec_path)
    log_path = Path(first.trial_dir) / "probe.log"
    timeout_s = sum(job.timeout_s for job in jobs)
    started = time.perf_counter()
    timed_out = False
    with open(log_path, "wb") as log:
        try:
            process = subprocess.Popen(
                probe_command(first, spec_paths),
                env=probe_env(first, visible_devices),
                cwd=first.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: killed as one
            )
        except OSError as exc:
            return [ProbeResult(status="error", error=f"cannot start torchrun: {exc}")] * len(jobs)
        try:
            exit_code: int | None = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            exit_code = None
            kill_process_group(process)
        except BaseException:
            kill_process_group(process)
            raise
        finally:
            # Ranks that outlived torchrun (e.g. after a crash) die with the group.
            _signal_group(process.pid, signal.SIGKILL)
    wall_s = time.perf_counter() - started
    log_tail = read_tail(log_path)
    results: list[ProbeResult] = []
    for job in jobs:
        reports = []
        for path in sorted(Path(job.trial_dir).glob("rank-*.json")):
            with contextlib.suppress(ValueError, OSError):
                reports.append(RankReport.model_validate_json(path.read_text(encoding="utf-8")))
        if not reports and results and results[-1].status != "ok":
            results.append(
                ProbeResult(
                    status="error",
                    error="not probed: the launch stopped at an earlier candidate",
                    exit_code=exit_code,
                    log_tail=log_tail,
                )
            )
            continue
        results.append(
            aggregate(
                job.spec,
                reports,
                world_size=job.world_size,
                exit_code=exit_code,
                timed_out=timed_out,
                wall_s=wall_s if len(jobs) == 1 else max((r.wall_s for r in reports), default=0),
                log_tail=log_tail,
            )
        )
    return results


def kill_process_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the probe's process group, then SIGKILL it after a grace period."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def read_tail(path: Path, limit: int = LOG_TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - limit))
            return log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _json_dump(data: object) -> str:
    import json

    return json.dumps(data, indent=2, sort_keys=True) + "\n"


class Executor(Protocol):
    """Runs probes concurrently up to ``capacity``; results come back in completion order."""

    capacity: int

    def submit(self, job: ProbeJob) -> int: ...

    def wait(self, timeout_s: float) -> list[tuple[int, ProbeResult]]: ...

    def cancel_all(self) -> None: ...

    def close(self) -> None: ...


class LocalExecutor:
    """Probes as subprocesses from driver threads; CUDA devices handed out from a pool."""

    def __init__(self, *, total_devices: int, devices_per_probe: int, cuda: bool) -> None:
        self.capacity = max(1, total_devices // devices_per_probe)
        self._devices_per_probe = devices_per_probe
        self._free_devices = list(range(total_devices)) if cuda else []
        self._cuda = cuda
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.capacity)
        self._futures: dict[concurrent.futures.Future[ProbeResult], int] = {}
        self._next_ticket = 0

    def submit(self, job: ProbeJob) -> int:
        devices: list[int] = []
        if self._cuda:
            with self._lock:
                devices = self._free_devices[: self._devices_per_probe]
                del self._free_devices[: self._devices_per_probe]
        visible = ",".join(map(str, devices)) if self._cuda else None
        future = self._pool.submit(self._run, job, visible, devices)
        ticket = self._next_ticket
        self._next_ticket += 1
        self._futures[future] = ticket
        return ticket

    def _run(self, job: ProbeJob, visible: str | None, devices: list[int]) -> ProbeResult:
        try:
            return launch_probe(job, visible)
        finally:
            with self._lock:
                self._free_devices.extend(devices)

    def wait(self, timeout_s: float) -> list[tuple[int, ProbeResult]]:
        if not self._futures:
            return []
        done, _ = concurrent.futures.wait(
            list(self._futures), timeout=timeout_s, return_when="FIRST_COMPLETED"
        )
        results = []
        for future in done:
            ticket = self._futures.pop(future)
            try:
                results.append((ticket, future.result()))
            except Exception as exc:  # noqa: BLE001 - a launcher bug must not end the study
                results.append((ticket, ProbeResult(status="error", error=f"launcher: {exc}")))
        return results

    def cancel_all(self) -> None:
        for future in self._futures:
            future.cancel()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _ray_probe_task(job: ProbeJob) -> ProbeResult:
    """Body of the Ray task: the GPUs Ray assigned are in CUDA_VISIBLE_DEVICES already."""
    restore_child_signals()
    return launch_probe(job, visible_devices=None)


class RayExecutor:
    """Each probe is a Ray core task holding ``devices_per_probe`` GPUs (or CPU-rank slots)."""

    def __init__(
        self, *, total_devices: int, devices_per_probe: int, cuda: bool, cpu_count: int
    ) -> None:
        # The probe's ranks are grandchildren of the Ray worker: only the subreaper reaps
        # them if a worker dies. Must be set before the raylet starts.
        os.environ.setdefault("RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper", "1")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        try:
            import ray
        except ImportError:
            raise ExecutorError(
                "Ray is not installed; pip install ray, or run with --executor local"
            ) from None
        self._ray = ray
        self.capacity = max(1, total_devices // devices_per_probe)
        if not ray.is_initialized():
            try:
                ray.init(
                    num_cpus=cpu_count,
                    num_gpus=total_devices if cuda else 0,
                    resources={} if cuda else {CPU_RANK_RESOURCE: total_devices},
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                )
            except Exception as exc:  # noqa: BLE001 - any start failure is one line
                raise ExecutorError(
                    f"Ray did not start ({type(exc).__name__}: {exc}); "
                    "run with --executor local to probe without Ray"
                ) from None
        resource = "GPU" if cuda else CPU_RANK_RESOURCE
        available = ray.cluster_resources().get(resource, 0)
        if available < devices_per_probe:
            raise ExecutorError(
                f"the Ray cluster offers {available:g} {resource} but a probe needs "
                f"{devices_per_probe}; start Ray with that resource or use --executor local"
            )
        options: dict[str, object] = {"num_cpus": 0, "max_retries": 0}
        if cuda:
            options["num_gpus"] = devices_per_probe
        else:
            options["resources"] = {CPU_RANK_RESOURCE: devices_per_probe}
        self._task = ray.remote(_ray_probe_task).options(**options)
        self._refs: dict[object, int] = {}
        self._next_ticket = 0

    def submit(self, job: ProbeJob) -> int:
        ref = self._task.remote(job)
        ticket = self._next_ticket
        self._next_ticket += 1
        self._refs[ref] = ticket
        return ticket

    def wait(self, timeout_s: float) -> list[tuple[int, ProbeResult]]:
        if not self._refs:
            return []
        ready, _ = self._ray.wait(list(self._refs), num_returns=1, timeout=timeout_s)
        results = []
        for ref in ready:
            ticket = self._refs.pop(ref)
            try:
                results.append((ticket, self._ray.get(ref)))
            except self._ray.exceptions.RayError as exc:  # worker died, task cancelled
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                results.append(
                    (
                        ticket,
                        ProbeResult(status="error", error=f"Ray: {type(exc).__name__} {first}"),
                    )
                )
        return results

    def cancel_all(self) -> None:
        """Interrupt the tasks (launch_probe then kills its probe's process group); tasks
        that do not end within the grace period are killed with their worker."""
        refs = list(self._refs)
        for ref in refs:
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=False)
        _, pending = self._ray.wait(refs, num_returns=len(refs), timeout=2 * KILL_GRACE_S)
        for ref in pending:
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)

    def close(self) -> None:
        self._refs.clear()


def make_executor(
    kind: str, *, total_devices: int, devices_per_probe: int, cuda: bool, cpu_count: int
) -> Executor:
    if kind == "local":
        return LocalExecutor(
            total_devices=total_devices, devices_per_probe=devices_per_probe, cuda=cuda
        )
    return RayExecutor(
        total_devices=total_devices,
        devices_per_probe=devices_per_probe,
        cuda=cuda,
        cpu_count=cpu_count,
    )
