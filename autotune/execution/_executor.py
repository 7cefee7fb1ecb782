"""Where probes run: slots of devices, each with a warm probe worker.

- :class:`RayExecutor` (default): each slot is a Ray actor holding K GPUs (or K CPU-rank
  slots on a machine without GPUs) and a :class:`~autotune.execution._worker.WarmWorker`, on a
  private
  Ray that listens on loopback only.
- ``--ray-address``: :class:`~autotune.execution._cluster.ClusterExecutor` on an existing cluster,
  whose probes may span nodes (ray is imported here and in the cluster modules only).
- :class:`LocalExecutor` (``--executor local``): the same workers driven from threads of
  the driver, for machines without Ray (Ray's wheel does not travel to every GPU box).

With ``warm=False`` every probe is a cold launch (:func:`autotune.execution.launch.launch_probe`),
as
DeepSpeed's autotuner does it; benchmarks compare the two.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import queue
import threading
from typing import Any, Protocol

from autotune.errors import ExecutorError
from autotune.execution import _priority as priority
from autotune.execution._cluster import CPU_RANK_RESOURCE  # Ray resource of CPU-rank probes
from autotune.execution._worker import WarmWorker
from autotune.execution.launch import ProbeJob, launch_probe, restore_child_signals
from autotune.protocol import ProbeResult

CANCEL_GRACE_S = 15.0


class Executor(Protocol):
    """Runs probes concurrently up to ``capacity``; results come back in completion order."""

    capacity: int

    def submit(self, job: ProbeJob) -> int: ...

    def wait(self, timeout_s: float) -> list[tuple[int, ProbeResult]]: ...

    def cancel_all(self) -> None: ...

    def close(self) -> None: ...


class _Slot:
    """One slot's worker: warm, or cold launches on the slot's devices."""

    def __init__(self, visible_devices: str | None, warm: bool) -> None:
        self.visible_devices = visible_devices
        self.worker = WarmWorker(visible_devices) if warm else None
        self._cancel = threading.Event()  # of a cold launch

    def run(self, job: ProbeJob) -> ProbeResult:
        # A user's script probes warm too (its __main__ run again in the same ranks) until a
        # warm run fails where a cold one measures; a loss run is always a launch.
        if self.worker is not None and job.spec.script is None:
            return self.worker.run(job)
        if self.worker is not None and job.spec.loss_run is None and self.worker.script_warm:
            result = self.worker.run(job)
        else:
            self._cancel.clear()
            result = launch_probe(job, self.visible_devices, self._cancel)
            if self._cancel.is_set():
                return ProbeResult(status="error", error="cancelled: the run was interrupted")
        if job.spec.script is not None:  # what the script's ranks could not say themselves
            from autotune.execution._script_outcome import explain

            return explain(job, result)
        return result

    def cancel(self) -> None:
        self._cancel.set()
        if self.worker is not None:
            self.worker.cancel()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


def slot_devices(capacity: int, devices_per_probe: int, parent_visible: str | None) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` of each slot: slot i gets entries i*K .. i*K+K-1 of the
    parent's list (indices such as ``4,5`` or GPU UUIDs, as SLURM and Kubernetes set it),
    or of ``0 .. N-1`` when the parent sets none. Raises ExecutorError when the parent's
    list is shorter than the slots need."""
    needed = capacity * devices_per_probe
    if parent_visible is None:
        entries = [str(index) for index in range(needed)]
    else:
        entries = [entry.strip() for entry in parent_visible.split(",") if entry.strip()]
        if len(entries) < needed:
            raise ExecutorError(
                f"CUDA_VISIBLE_DEVICES={parent_visible!r} lists {len(entries)} device(s) but "
                f"{capacity} slot(s) of {devices_per_probe} need {needed}; lower --gpus or "
                "make more devices visible"
            )
    return [
        ",".join(entries[index * devices_per_probe : (index + 1) * devices_per_probe])
        for index in range(capacity)
    ]


class LocalExecutor:
    """Slots driven from threads of the driver; CUDA devices split between slots."""

    def __init__(
        self, *, total_devices: int, devices_per_probe: int, cuda: bool, warm: bool = True
    ) -> None:
        self.capacity = max(1, total_devices // devices_per_probe)
        self._idle: queue.SimpleQueue[_Slot] = queue.SimpleQueue()
        self._slots = []
        # never plain indices over the parent's list: SLURM or Kubernetes may give 4,5
        parent = os.environ.get("CUDA_VISIBLE_DEVICES")
        visible: list[str | None] = (
            list(slot_devices(self.capacity, devices_per_probe, parent))
            if cuda
            else [None] * self.capacity
        )
        for devices in visible:
            slot = _Slot(devices, warm)
            self._slots.append(slot)
            self._idle.put(slot)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.capacity)
        self._futures: dict[concurrent.futures.Future[ProbeResult], int] = {}
        self._next_ticket = 0

    def submit(self, job: ProbeJob) -> int:
        slot = self._idle.get_nowait()  # the tuner never submits beyond capacity
        future = self._pool.submit(self._run, slot, job)
        ticket = self._next_ticket
        self._next_ticket += 1
        self._futures[future] = ticket
        return ticket

    def _run(self, slot: _Slot, job: ProbeJob) -> ProbeResult:
        try:
            return slot.run(job)
        finally:
            self._idle.put(slot)

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
        """Stop running probes (their process groups are killed) and wait for them."""
        for slot in self._slots:
            slot.cancel()
        concurrent.futures.wait(list(self._futures), timeout=CANCEL_GRACE_S)

    def close(self) -> None:
        for slot in self._slots:
            slot.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class _RaySlot:
    """Body of the Ray actor of one slot (two concurrent calls: run, and cancel)."""

    def __init__(self, warm: bool) -> None:
        # A Ray worker ignores SIGCHLD; the probes are its children (see the function).
        restore_child_signals()
        self.slot = _Slot(None, warm)  # Ray has set CUDA_VISIBLE_DEVICES for the actor

    def run(self, job: ProbeJob) -> ProbeResult:
        return self.slot.run(job)

    def cancel(self) -> None:
        self.slot.cancel()

    def close(self) -> None:
        self.slot.close()


class RayExecutor:
    """Each slot is a Ray actor holding ``devices_per_probe`` GPUs (or CPU-rank slots)."""

    def __init__(
        self,
        *,
        total_devices: int,
        devices_per_probe: int,
        cuda: bool,
        cpu_count: int,
        warm: bool = True,
    ) -> None:
        set_ray_environment()
        try:
            import ray
        except ImportError:
            raise ExecutorError(
                "Ray is not installed; pip install ray, or run with --executor local"
            ) from None
        self._ray = ray
        self.capacity = max(1, total_devices // devices_per_probe)
        # a Ray this executor starts is its own to stop at close (a run's finish is timed)
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            try:
                init_loopback_ray(
                    ray,
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
            restore_child_signals()
        resource = "GPU" if cuda else CPU_RANK_RESOURCE
        available = ray.cluster_resources().get(resource, 0)
        if available < devices_per_probe * self.capacity:
            raise ExecutorError(
                f"the Ray cluster offers {available:g} {resource} but {self.capacity} slot(s) "
                f"of {devices_per_probe} are needed; start Ray with that resource or use "
                "--executor local"
            )
        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0, "max_concurrency": 2}
        if cuda:
            options["num_gpus"] = devices_per_probe
        else:
            options["resources"] = {CPU_RANK_RESOURCE: devices_per_probe}
        actor_class = ray.remote(_RaySlot).options(**options)
        self._actors = [actor_class.remote(warm) for _ in range(self.capacity)]
        self._idle = list(self._actors)
        self._refs: dict[Any, tuple[int, Any]] = {}
        self._next_ticket = 0

    def submit(self, job: ProbeJob) -> int:
        actor = self._idle.pop()
        ref = actor.run.remote(job)
        ticket = self._next_ticket
        self._next_ticket += 1
        self._refs[ref] = (ticket, actor)
        return ticket

    def wait(self, timeout_s: float) -> list[tuple[int, ProbeResult]]:
        if not self._refs:
            return []
        ready, _ = self._ray.wait(list(self._refs), num_returns=1, timeout=timeout_s)
        results = []
        for ref in ready:
            ticket, actor = self._refs.pop(ref)
            self._idle.append(actor)
            try:
                results.append((ticket, self._ray.get(ref)))
            except self._ray.exceptions.RayError as exc:  # the actor's worker died
                # Ray's text is a header line, the remote traceback, then the exception.
                lines = [line for line in str(exc).strip().splitlines() if line.strip()]
                cause = lines[-1].strip() if lines else ""
                error = f"Ray: {type(exc).__name__}: {cause}"
                results.append((ticket, ProbeResult(status="error", error=error)))
        return results

    def cancel_all(self) -> None:
        """Stop running probes: each busy actor kills its probe's process group."""
        busy = {actor for _, actor in self._refs.values()}
        for actor in busy:
            with contextlib.suppress(Exception):
                actor.cancel.remote()
        refs = list(self._refs)
        if refs:
            self._ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE_S)

    def close(self) -> None:
        closing = []
        for actor in self._actors:
            with contextlib.suppress(Exception):
                closing.append(actor.close.remote())
        with contextlib.suppress(Exception):
            self._ray.wait(closing, num_returns=len(closing), timeout=CANCEL_GRACE_S)
        for actor in self._actors:
            with contextlib.suppress(Exception):
                self._ray.kill(actor)
        self._refs.clear()
        if self._owns_ray:
            with contextlib.suppress(Exception):
                self._ray.shutdown()


def set_ray_environment() -> None:
    """What a private Ray reads from the environment at its start (its raylet and workers):
    set before ``ray.init`` starts one, here and in the test suite's shared Ray."""
    # The probe's ranks are grandchildren of the Ray worker: only the subreaper reaps them
    # if a worker dies.
    os.environ.setdefault("RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    # its workers (and the probes under them) at the driver's priority, not Ray's nice 15
    os.environ.setdefault(priority.RAY_WORKER_NICENESS, str(priority.current()))


def init_loopback_ray(ray: Any, **options: Any) -> None:
    """Start a private Ray whose GCS, raylet, workers and agents listen on 127.0.0.1 only.

    Ray binds them to loopback exactly when the node's address is 127.0.0.1, but turns a
    given 127.0.0.1 into the machine's network address unless it takes multi-node clusters
    for unsupported (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read at its import and by the
    processes it starts): both are set for this start only (a later ``--ray-address`` join
    in the same process needs them back).
    """
    from ray._private import ray_constants

    name = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    saved_env, saved_flag = os.environ.get(name), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[name], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        ray.init(address="local", _node_ip_address="127.0.0.1", **options)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved_env


def make_executor(
    kind: str,
    *,
    total_devices: int,
    devices_per_probe: int,
    cuda: bool,
    cpu_count: int,
    warm: bool = True,
    ray_address: str | None = None,
) -> Executor:
    if kind == "ray" and ray_address is not None:
        from autotune.execution._cluster import ClusterExecutor  # an existing cluster's nodes

        return ClusterExecutor(
            address=ray_address,
            total_devices=total_devices,
            devices_per_probe=devices_per_probe,
            cuda=cuda,
            warm=warm,
        )
    if kind == "local":
        return LocalExecutor(
            total_devices=total_devices, devices_per_probe=devices_per_probe, cuda=cuda, warm=warm
        )
    return RayExecutor(
        total_devices=total_devices,
        devices_per_probe=devices_per_probe,
        cuda=cuda,
        cpu_count=cpu_count,
        warm=warm,
    )
