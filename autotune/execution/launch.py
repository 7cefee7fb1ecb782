"""Launching probe ranks: the command, the environment, signals, and one-shot launches.

:func:`launch_probes` starts the ranks of ``autotune.probe.rank --spec ...``
(:func:`probe_command`: forked on CPU, under torchrun elsewhere) in their own process group
under a hard timeout and turns whatever happened into
:class:`~autotune.protocol.ProbeResult` s. Warm workers (:mod:`autotune.execution._worker`)
use the same command and environment with ``--serve``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from autotune.backends.deepspeed import (
    PRELOAD_OPS_VARIABLE,
    adam_builder,
    tools_path,
    torch_extensions_dir,
)
from autotune.execution import _priority as priority
from autotune.protocol import ProbeResult, ProbeSpec, RankReport
from autotune.rank_outcome import aggregate
from autotune.settings import TF32_CUBLAS_OVERRIDE_ENV, tf32_cublas_override

LOG_TAIL_CHARS = 4000
KILL_GRACE_S = 5.0


class ProbeJob(BaseModel):
    """A probe plus where and how to launch it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: ProbeSpec
    trial_dir: str = Field(description="Absolute folder for spec, rank reports and the log.")
    world_size: int = Field(description="Ranks (devices) of the probe.")
    timeout_s: float = Field(description="Hard limit, launch to exit.")
    threads_per_rank: int = Field(description="OMP/MKL threads of each rank, as in production.")
    cwd: str = Field(description="Working directory (the driver's), for user workload paths.")
    python_path: list[str] = Field(
        default_factory=list,
        description="Folders the probe imports user code from (a workload file's folder); "
        "the working directory is not one of them, so a yaml.py there shadows nothing.",
    )
    scratch_dir: str | None = Field(
        default=None,
        description="Absolute folder of this probe alone (its NVMe swap files): created before "
        "the probe and removed after it, whatever the outcome.",
    )
    niceness: int = Field(
        default_factory=priority.current,
        description="The scheduling priority the probe runs at: the driver's, as production "
        "launched from the same shell (a Ray worker's own is nice 15; "
        "see autotune.execution._priority).",
    )

    @field_validator("scratch_dir")
    @classmethod
    def _scratch_is_a_subfolder(cls, value: str | None) -> str | None:
        # removed recursively after the probe: never a root or a top-level folder
        if value is not None and (not os.path.isabs(value) or len(Path(value).parts) < 3):
            raise ValueError(
                f"scratch_dir must be an absolute folder at least two levels deep, got {value!r}"
            )
        return value


def group_shape(job: ProbeJob) -> tuple[object, ...]:
    """What a group of ranks is started with, which every job it serves must share: ranks,
    threads, working folder, accelerator, and the TF32 override of its environment."""
    return (
        job.world_size,
        job.threads_per_rank,
        job.cwd,
        job.spec.accelerator,
        tf32_cublas_override(job.spec.float32_matmul_precision),
    )


def probe_env(job: ProbeJob, visible_devices: str | None) -> dict[str, str]:
    """The environment of a probe: production threading, the accelerator, the numerics the
    study asks for, quiet libraries."""
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
    # Only what the user named goes on the path: a yaml.py or torch.py in the working folder
    # must not shadow the real package in every rank (PYTHONSAFEPATH, Python 3.11+, keeps
    # the interpreter from adding the working folder itself; autotune.probe drops it on 3.10)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*job.python_path, env.get("PYTHONPATH")]))
    env["PYTHONSAFEPATH"] = "1"
    # The study's TF32 choice (--tf32), explicitly, as launch.sh sets it: an inherited
    # override (NGC's PyTorch containers export 1) would time IEEE-fp32 probes with TF32.
    # ATen reads it once per process: every job of a group shares it (group_shape).
    env[TF32_CUBLAS_OVERRIDE_ENV] = tf32_cublas_override(job.spec.float32_matmul_precision)
    env[priority.NICENESS_VARIABLE] = str(job.niceness)
    env["TORCH_EXTENSIONS_DIR"] = torch_extensions_dir()
    env["PATH"] = tools_path(env.get("PATH"))  # ops build with this environment's ninja
    if job.spec.accelerator == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        # Without LOCAL_SIZE DeepSpeed's CPU backend skips its shared-memory all-reduce, which
        # only inference uses and which leaves a buffer per rank in /dev/shm when a probe is
        # killed; training collectives go through gloo either way.
        env.pop("LOCAL_SIZE", None)
        env[PRELOAD_OPS_VARIABLE] = adam_builder(job.spec.backend_config) or ""
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices
    return env


# Ray workers ignore SIGCHLD and block SIGINT; children inherit both across exec, and then
# torchrun cannot reap its ranks (py-cpuinfo's helper process, spawned inside
# deepspeed.initialize, hung forever that way). This prelude restores the defaults, then
# execs torchrun.
#
# It also asks the kernel to SIGKILL torchrun when the process that started it dies (a
# driver killed with -9, a Ray actor torn down): a warm group must not outlive its driver.
# The ranks do the same for torchrun (autotune.probe), so the whole tree goes.
_CLEAN_SIGNALS_EXEC = (
    "import os, signal, sys; "
    "from autotune.probe import die_with_parent; die_with_parent(); "
    "from autotune.execution._priority import take_from_environment; take_from_environment(); "
    "signal.signal(signal.SIGCHLD, signal.SIG_DFL); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "signal.pthread_sigmask(signal.SIG_SETMASK, []); "
    "os.execv(sys.executable, [sys.executable] + sys.argv[1:])"
)
_PRELUDE = [sys.executable, "-c", _CLEAN_SIGNALS_EXEC, "-m"]


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


def probe_command(job: ProbeJob, probe_args: list[str]) -> list[str]:
    """The launch of ``python -m autotune.probe.rank PROBE_ARGS`` on the job's ranks: CPU ranks
    forked from a launcher that has imported their code (:mod:`autotune.probe.fork_ranks`), other
    ranks under torchrun (of ``autotune.probe.script_rank`` when the user's script is the probe).
    Either launcher's stores and ranks listen on loopback only."""
    if job.spec.script is None and job.spec.accelerator == "cpu":
        return [
            *_PRELUDE,
            "autotune.probe.fork_ranks",
            f"--nproc-per-node={job.world_size}",
            f"--workload={job.spec.workload}",
            "--",
            *probe_args,
        ]
    module = "autotune.probe.script_rank" if job.spec.script is not None else "autotune.probe.rank"
    return torchrun_command(job, module, probe_args)


def torchrun_command(job: ProbeJob, module: str, probe_args: list[str]) -> list[str]:
    """The launch of ``python -m MODULE PROBE_ARGS`` on the job's ranks under torchrun, its
    store and ranks on loopback (:mod:`autotune.probe.loopback_run`)."""
    return [
        *_PRELUDE,
        "autotune.probe.loopback_run",
        "--standalone",
        f"--nproc-per-node={job.world_size}",
        "--max-restarts=0",
        "-m",
        module,
        *probe_args,
    ]


def launch_probe(
    job: ProbeJob, visible_devices: str | None = None, cancel: threading.Event | None = None
) -> ProbeResult:
    """Run one probe to completion, timeout or ``cancel``; never raises for what the probe
    did."""
    return launch_probes([job], visible_devices, cancel)[0]


def launch_probes(
    jobs: list[ProbeJob], visible_devices: str | None = None, cancel: threading.Event | None = None
) -> list[ProbeResult]:
    """Probe several candidates in one torchrun launch, one after the other.

    The ranks pay interpreter start, imports and process-group set-up once for all of them.
    The jobs must share world size, working directory and threads; the launch's timeout is
    the sum of theirs. If a candidate fails, the ranks exit and later candidates are
    reported as not probed. If the ranks find an earlier candidate's memory still allocated
    (``unclean``), that candidate and the rest go to a fresh launch; so does a candidate
    whose environment differs from the launch's (:func:`group_shape`: its TF32 override).
    Each job's scratch folder is removed once the launch is over.
    """
    first = jobs[0]
    if any(
        (j.world_size, j.cwd, j.threads_per_rank)
        != (first.world_size, first.cwd, first.threads_per_rank)
        for j in jobs
    ):
        raise ValueError("jobs launched together must share world size, cwd and threads")
    try:
        results: list[ProbeResult] = []
        leaked = 0
        while len(results) < len(jobs):
            if results and (results[-1].status != "ok" or (cancel and cancel.is_set())):
                results += [_NOT_PROBED.model_copy() for _ in jobs[len(results) :]]
                break
            launched, unclean = _launch(_alike(jobs[len(results) :]), visible_devices, cancel)
            launched[0].leak_restart_bytes = leaked
            results += launched
            leaked = unclean
        return results
    finally:
        for job in jobs:
            remove_scratch(job)


# a candidate after one that failed (or after a cancel): never started
_NOT_PROBED = ProbeResult(
    status="error", error="not probed: the launch stopped at an earlier candidate"
)


def _alike(jobs: list[ProbeJob]) -> list[ProbeJob]:
    """The leading jobs that one group of ranks can serve: the first's group shape."""
    shape = group_shape(jobs[0])
    return list(itertools.takewhile(lambda job: group_shape(job) == shape, jobs))


def _launch(
    jobs: list[ProbeJob], visible_devices: str | None, cancel: threading.Event | None = None
) -> tuple[list[ProbeResult], int]:
    """One torchrun launch of ``jobs``: the results up to the first candidate (not the
    launch's first) whose ranks were unclean, and the bytes they found left behind (0 if
    none were). A fresh launch's first candidate is never unclean."""
    first = jobs[0]
    restore_child_signals()
    spec_paths = [prepare_trial_dir(job) for job in jobs]
    log_path = Path(first.trial_dir) / "probe.log"
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        try:
            process = subprocess.Popen(
                probe_command(first, [a for p in spec_paths for a in ("--spec", str(p))]),
                env=probe_env(first, visible_devices),
                cwd=first.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: killed as one
            )
        except OSError as exc:
            failed = ProbeResult(status="error", error=f"cannot start torchrun: {exc}")
            return [failed.model_copy() for _ in jobs], 0
        exit_code, timed_out = _wait_group(process, sum(job.timeout_s for job in jobs), cancel)
    wall_s = time.perf_counter() - started
    return _launch_results(jobs, exit_code, timed_out, wall_s, read_tail(log_path))


def _wait_group(
    process: subprocess.Popen[bytes], timeout_s: float, cancel: threading.Event | None
) -> tuple[int | None, bool]:
    """Torchrun's exit code (None if it was killed) and whether it ran past ``timeout_s``;
    its whole process group is killed once it ends, whatever ended it."""
    track_group(process.pid)
    try:
        return _wait(process, timeout_s, cancel), False
    except subprocess.TimeoutExpired:
        kill_process_group(process)
        return None, True
    except BaseException:
        kill_process_group(process)
        raise
    finally:
        # Ranks that outlived torchrun (e.g. after a crash) die with the group.
        signal_group(process.pid, signal.SIGKILL)
        untrack_group(process.pid)


def _launch_results(
    jobs: list[ProbeJob], exit_code: int | None, timed_out: bool, wall_s: float, log_tail: str
) -> tuple[list[ProbeResult], int]:
    """Each job's result from its ranks' reports, up to the first (not the launch's first)
    whose ranks were unclean, and the bytes those found left behind (0 if none were)."""
    results: list[ProbeResult] = []
    for index, job in enumerate(jobs):
        reports = read_reports(job)
        leaked = unclean_bytes(reports)
        if leaked and index > 0:
            return results, leaked  # this one and the rest go to a fresh launch
        if not reports and results and results[-1].status != "ok":
            results.append(
                _NOT_PROBED.model_copy(update={"exit_code": exit_code, "log_tail": log_tail})
            )
            continue
        # A candidate every rank finished is not failed by a later one that ended the launch.
        finished = len(jobs) > 1 and {r.rank for r in reports} == set(range(job.world_size))
        result = aggregate(
            job.spec,
            reports,
            world_size=job.world_size,
            exit_code=0 if finished else exit_code,
            timed_out=timed_out and not finished,
            wall_s=wall_s if len(jobs) == 1 else max((r.wall_s for r in reports), default=0),
            log_tail=log_tail,
        )
        result.cold_start = index == 0
        results.append(result)
    return results, 0


def _wait(
    process: subprocess.Popen[bytes], timeout_s: float, cancel: threading.Event | None
) -> int:
    """The exit code; TimeoutExpired after ``timeout_s`` or once ``cancel`` is set."""
    deadline = time.perf_counter() + timeout_s
    while not (cancel and cancel.is_set()) and time.perf_counter() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return process.wait(timeout=0.2)
    raise subprocess.TimeoutExpired(process.args, timeout_s)


def unclean_bytes(reports: list[RankReport]) -> int:
    """The leak the ranks reported when they refused to probe (``unclean``): allocated, and
    outside the allocator; else 0."""
    return max(
        (r.leaked_bytes + r.overhead_left_bytes for r in reports if r.status == "unclean"),
        default=0,
    )


def remove_scratch(job: ProbeJob) -> None:
    """Delete the job's scratch folder (NVMe swap files of a finished, failed or killed
    probe); a rank still closing its files keeps only the open inodes until it exits."""
    if job.scratch_dir:
        shutil.rmtree(job.scratch_dir, ignore_errors=True)


def prepare_trial_dir(job: ProbeJob) -> Path:
    """Write the job's spec and DeepSpeed config into its trial folder; return the spec."""
    trial_dir = Path(job.trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    for stale in trial_dir.glob("rank-*.json"):
        stale.unlink()
    if job.scratch_dir:
        Path(job.scratch_dir).mkdir(parents=True, exist_ok=True)
    spec_path = trial_dir / "spec.json"
    spec_path.write_text(job.spec.model_dump_json(indent=1), encoding="utf-8")
    (trial_dir / "ds_config.json").write_text(_json_dump(job.spec.backend_config), encoding="utf-8")
    return spec_path


def read_reports(job: ProbeJob) -> list[RankReport]:
    """The rank reports written so far in the job's trial folder."""
    reports = []
    for path in sorted(Path(job.trial_dir).glob("rank-*.json")):
        with contextlib.suppress(ValueError, OSError):
            reports.append(RankReport.model_validate_json(path.read_text(encoding="utf-8")))
    return reports


# Process groups of this process's live probes, for a last-resort kill (a second Ctrl-C
# exits at once, without waiting for the executor's orderly cancel).
_LIVE_GROUPS: set[int] = set()


def track_group(pgid: int) -> None:
    _LIVE_GROUPS.add(pgid)


def untrack_group(pgid: int) -> None:
    _LIVE_GROUPS.discard(pgid)


def kill_all_groups() -> None:
    """SIGKILL every live probe group this process started (async-signal tolerant)."""
    for pgid in list(_LIVE_GROUPS):
        signal_group(pgid, signal.SIGKILL)


def kill_process_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the probe's process group, then SIGKILL it after a grace period."""
    signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        signal_group(process.pid, signal.SIGKILL)
        process.wait()
    untrack_group(process.pid)


def signal_group(pgid: int, sig: signal.Signals) -> None:
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
