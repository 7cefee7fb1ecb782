"""Probes on an existing Ray cluster (``--ray-address``): join it, check what it offers,
reserve the slots' devices, run the slots.

- :func:`connect` joins the cluster (``auto``, ``HOST:PORT`` of its GCS, or ``ray://HOST:PORT``
  of its client server); anything that goes wrong is one :class:`ExecutorError` line.
- :func:`check_offer` compares what the live nodes offer (``GPU``, or the CPU-rank resource
  on machines without GPUs) with ``--gpus`` and says in one line what is missing.
- :func:`slot_layout`: a probe of K devices that fits one node is placed ``STRICT_PACK`` (all
  its ranks on one node, as a K-device production job on such a node runs); a larger one
  ``PACK`` (as few nodes as possible, each filled, as production fills its nodes). SPREAD
  would put 2 ranks on each of 8 nodes for a 16-rank probe on 8-device nodes, and measure
  inter-node traffic that production on 2 full nodes does not have.
- :class:`ClusterExecutor`: one placement group and one
:class:`~autotune.execution._spanning_slot.SpanningSlot`
  per slot, driven from threads of the driver. A probe that lost a node comes back as an
  error with ``lost_node`` set; a slot Ray can no longer place is retired; when the cluster
  no longer holds one probe, or the driver loses the cluster, the next call raises
  :class:`ExecutorError` (one line): the study stays in its storage and continues from any
  machine that reaches a cluster.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from autotune.errors import ExecutorError, SettingsError
from autotune.execution import _priority as priority
from autotune.execution.launch import ProbeJob
from autotune.protocol import ProbeResult

if TYPE_CHECKING:
    from autotune.hardware import Hardware

CPU_RANK_RESOURCE = "autotune_cpu_rank"  # the same resource the private Ray offers
RESERVE_TIMEOUT_S = 120.0  # for Ray to reserve the slots' devices
CONNECT_TIMEOUT_S = 10.0  # for the head's port to answer at all
CANCEL_GRACE_S = 30.0
WATCH_PERIOD_S = 5.0  # how often the driver asks the GCS whether it is still there
GCS_TIMEOUT_S = 20.0  # a GCS silent this long is lost (Ray itself would wait 60 s, then exit)


RAY_ADDRESS = re.compile(
    r"^(?:ray://)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})$"
)


def check_ray_address(address: str, executor: str) -> None:
    """``--ray-address``: auto, HOST:PORT or ray://HOST:PORT, and only with Ray probes."""
    if executor == "local":
        raise SettingsError(
            f"--ray-address {address} with --executor local: a cluster runs probes through Ray; "
            "drop --executor local"
        )
    match = RAY_ADDRESS.match(address)
    if address != "auto" and (match is None or not 0 < int(match["port"]) < 65536):
        raise SettingsError(
            f"--ray-address {address!r}: give auto, HOST:PORT of the cluster's head (its GCS "
            "port, 6379 by default) or ray://HOST:PORT (its client server, 10001 by default)"
        )


def connect(address: str) -> Any:
    """Join the Ray cluster at ``address``; the ``ray`` module."""
    import os

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if ray.is_initialized():
        return ray
    _check_reachable(address)
    # Ray ends a driver whose GCS is silent for this long; autotune's own watchdog says so
    # in one line sooner (GCS_TIMEOUT_S) and needs the rest to stop cleanly.
    os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "120")
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except Exception as exc:  # noqa: BLE001 - any failure to join is one line
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ExecutorError(
            f"--ray-address {address}: cannot join the Ray cluster ({type(exc).__name__}: "
            f"{first}); check that `ray start --head` runs there, that this machine reaches its "
            "GCS port, and (with token auth) that RAY_AUTH_TOKEN or ~/.ray/auth_token holds "
            "the cluster's token"
        ) from None
    return ray


def cluster_hardware(address: str, node_paths: tuple[str, ...] = ()) -> Hardware:
    """What a node of the cluster offers probes (the driver's machine may have no GPU): the
    hardware a task holding one device sees there, with the cluster's device count.
    ``node_paths`` (a script and the working folder) must be on every live node."""
    ray = connect(address)
    check_node_paths(ray, node_paths, address)
    gpus = sum(node_offer(ray, "GPU").values())
    options: dict[str, Any] = {"num_cpus": 0, "max_retries": 0}
    if gpus:
        options["num_gpus"] = 1
    else:
        options["resources"] = {CPU_RANK_RESOURCE: 1}
    ref = ray.remote(_detect_at).options(**options).remote(priority.current())
    ready, _ = ray.wait([ref], timeout=RESERVE_TIMEOUT_S)
    if not ready:
        ray.cancel(ref, force=True)
        offer = node_offer(ray, "GPU" if gpus else CPU_RANK_RESOURCE)
        raise ExecutorError(
            f"--ray-address {address}: no node took a task holding one device within "
            f"{RESERVE_TIMEOUT_S:.0f} s (the cluster offers "
            f"{describe_offer(offer, 'GPU' if gpus else CPU_RANK_RESOURCE)}; other jobs hold "
            "them?)"
        )
    hardware: Hardware = ray.get(ref)
    offer = node_offer(ray, "GPU" if gpus else CPU_RANK_RESOURCE)
    total = gpus or sum(offer.values())
    return hardware.model_copy(
        update={"device_count": total, "devices_per_node": max(offer.values(), default=1)}
    )


def check_node_paths(ray: Any, paths: tuple[str, ...], address: str) -> None:
    """Refuse, in one line, a cluster with a live node that lacks one of ``paths``: a script
    probe's ranks run the script, in the driver's working folder, at the driver's paths."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not paths:
        return
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    check = ray.remote(_missing_paths)
    refs = {
        check.options(
            num_cpus=0,
            max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        ).remote(paths): node
        for node in nodes
    }
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=RESERVE_TIMEOUT_S)
    for ref in ready:
        missing = ray.get(ref)
        if missing:
            node = refs[ref]
            where = f"{node.get('NodeManagerAddress', '?')} (node {node['NodeID'][:8]})"
            raise ExecutorError(
                f"{missing[0]} is not on {where} of the Ray cluster at {address}: a script's "
                "ranks run it, in the driver's working folder, at the driver's paths on every "
                "node; put both there (a shared filesystem, or copies at the same paths)"
            )


def _missing_paths(paths: tuple[str, ...]) -> list[str]:
    import os

    return [path for path in paths if not os.path.exists(path)]


def _detect_at(niceness: int) -> Hardware:
    """:func:`autotune.hardware.detect` in a Ray task, at the driver's priority where the
    node allows it (a Ray worker runs at nice 15: on a busy node its imports alone can take
    minutes)."""
    from autotune.hardware import detect

    priority.take(niceness)
    return detect()


def _check_reachable(address: str) -> None:
    """One line at once for a head nobody answers at (Ray itself retries for minutes)."""
    import socket

    match = RAY_ADDRESS.match(address)
    if match is None:  # auto: Ray finds the local cluster's address, or says there is none
        return
    host = match["host"].strip("[]")
    try:
        socket.create_connection((host, int(match["port"])), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ExecutorError(
            f"--ray-address {address}: nothing answers there ({exc.strerror or exc}); start "
            "the head with `ray start --head --port PORT` and check that this machine reaches "
            "it (firewall, address)"
        ) from None


def node_offer(ray: Any, resource: str) -> dict[str, int]:
    """Devices of ``resource`` each live node offers, by node address (ids for duplicates)."""
    offer: dict[str, int] = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        count = int(node.get("Resources", {}).get(resource, 0))
        name = node.get("NodeManagerAddress", "?")
        if name in offer:
            name = f"{name} ({node['NodeID'][:8]})"
        offer[name] = count
    return offer


def describe_offer(offer: dict[str, int], resource: str) -> str:
    per_node = ", ".join(f"{name}: {count}" for name, count in offer.items()) or "no live node"
    return f"{sum(offer.values())} {resource} ({per_node})"


def check_offer(
    offer: dict[str, int], resource: str, total: int, per_probe: int, address: str
) -> None:
    """Refuse, in one line, a cluster that does not offer ``--gpus`` devices."""
    if sum(offer.values()) >= max(total, per_probe):
        return
    if resource == CPU_RANK_RESOURCE:
        how = (
            f"start each node with --resources='{{\"{CPU_RANK_RESOURCE}\": N}}' (N CPU ranks, "
            "at most one per core)"
        )
    else:
        how = "add nodes with GPUs (ray start --address ... on each)"
    raise ExecutorError(
        f"--gpus {total}: the Ray cluster at {address} offers {describe_offer(offer, resource)}; "
        f"{how}, or lower --gpus to {sum(offer.values())}"
    )


def slot_layout(offer: dict[str, int], total: int, per_probe: int) -> tuple[int, str]:
    """How many probes of ``per_probe`` devices run at once within ``total``, and the
    placement strategy of each (see the module docstring)."""
    if per_probe <= max(offer.values(), default=0):
        on_one_node = sum(count // per_probe for count in offer.values())
        return max(0, min(total // per_probe, on_one_node)), "STRICT_PACK"
    return min(total, sum(offer.values())) // per_probe, "PACK"


class ClusterExecutor:
    """Slots of ``devices_per_probe`` devices on a Ray cluster; see the module docstring.

    Each probe runs in a daemon thread of the driver and a watchdog asks the cluster's GCS
    every :data:`WATCH_PERIOD_S`: a driver that lost its cluster has Ray calls that never
    return, and must still say so in one line and exit.
    """

    def __init__(
        self, *, address: str, total_devices: int, devices_per_probe: int, cuda: bool, warm: bool
    ) -> None:
        from autotune.execution._spanning_slot import SpanningSlot

        ray = connect(address)
        self._ray, self._address = ray, address
        self._resource = "GPU" if cuda else CPU_RANK_RESOURCE
        self._per_probe = devices_per_probe
        self._fatal: ExecutorError | None = None
        self._gone = False  # the GCS does not answer: no Ray call may be made any more
        self._closed = threading.Event()
        self._groups: list[Any] = []
        self._slots: list[Any] = []
        offer = node_offer(ray, self._resource)
        check_offer(offer, self._resource, total_devices, devices_per_probe, address)
        capacity, strategy = slot_layout(offer, total_devices, devices_per_probe)
        if capacity < 1:
            raise ExecutorError(
                f"--gpus-per-trial {devices_per_probe}: no node of the Ray cluster at {address} "
                f"offers that many; it offers {describe_offer(offer, self._resource)}"
            )
        self._reserve(capacity, strategy)
        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0, "max_concurrency": 4}
        if cuda:
            options["num_gpus"] = 1
        else:
            options["resources"] = {CPU_RANK_RESOURCE: 1}
        self._slots = [SpanningSlot(ray, g, devices_per_probe, options, warm) for g in self._groups]
        self._idle: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for slot in self._slots:
            self._idle.put(slot)
        self._capacity = capacity
        self._results: queue.SimpleQueue[tuple[int, ProbeResult]] = queue.SimpleQueue()
        self._running: set[int] = set()
        self._next_ticket = 0
        threading.Thread(target=self._watch, name="autotune-cluster-watch", daemon=True).start()

    def _reserve(self, capacity: int, strategy: str) -> None:
        """One placement group of the probe's devices per slot, reserved now."""
        from ray.util.placement_group import placement_group

        bundle = {self._resource: 1}
        self._groups = [
            placement_group([bundle] * self._per_probe, strategy=strategy) for _ in range(capacity)
        ]
        ready, _ = self._ray.wait(
            [g.ready() for g in self._groups], num_returns=capacity, timeout=RESERVE_TIMEOUT_S
        )
        if len(ready) < capacity:
            self.close()
            raise ExecutorError(
                f"the Ray cluster at {self._address} did not reserve {capacity} x "
                f"{self._per_probe} {self._resource} within {RESERVE_TIMEOUT_S:.0f} s (other "
                "jobs hold them?); lower --gpus or free devices"
            )

    @property
    def capacity(self) -> int:
        """Probes that may run at once. Raises the one-line ExecutorError once the driver
        lost the cluster or the cluster cannot hold a probe, so that no trial is asked for
        a probe that cannot run."""
        if self._fatal is not None:
            raise self._fatal
        return self._capacity

    def submit(self, job: ProbeJob) -> int:
        self._check_cluster()
        slot = self._idle.get_nowait()  # the tuner never submits beyond capacity
        ticket = self._next_ticket
        self._next_ticket += 1
        self._running.add(ticket)
        # A daemon thread: one stuck in a Ray call to a lost cluster must not hold the exit.
        threading.Thread(target=self._run, args=(slot, job, ticket), daemon=True).start()
        return ticket

    def _run(self, slot: Any, job: ProbeJob, ticket: int) -> None:
        from autotune.execution._spanning_slot import ActorFailed, Unplaced

        try:
            result = slot.run(job)
            self._idle.put(slot)
        except ActorFailed as exc:
            self._idle.put(slot)
            result = ProbeResult(status="error", error=f"not probed: {exc}")
        except Unplaced as exc:
            self._retire(slot)
            result = ProbeResult(
                status="error",
                error=f"node lost: not probed, {exc}; the candidate may be probed again",
                lost_node="unplaced",
            )
        except Exception as exc:  # noqa: BLE001 - a launcher bug must not end the study
            self._idle.put(slot)
            result = ProbeResult(status="error", error=f"launcher: {type(exc).__name__}: {exc}")
        if result.lost_node:
            self._check_cluster(raise_now=False)  # the next ask waits for the verdict
        self._results.put((ticket, result))

    def _retire(self, slot: Any) -> None:
        """A slot Ray can no longer place: the study goes on with the others."""
        self._capacity -= 1
        slot.close()
        if self._capacity < 1:
            self._fatal = self._lost_capacity()

    def _lost_capacity(self) -> ExecutorError:
        offer = node_offer(self._ray, self._resource)
        return ExecutorError(
            f"the Ray cluster at {self._address} lost nodes: it offers "
            f"{describe_offer(offer, self._resource)} and a probe needs {self._per_probe}; add "
            "nodes and run again to continue the study"
        )

    def _check_cluster(self, raise_now: bool = True) -> None:
        """Raise the one line of a cluster this driver lost, or one that cannot hold a probe."""
        if self._fatal is None:
            offer = self._answer(lambda: node_offer(self._ray, self._resource))
            if offer is None:
                self._lost_gcs()
            elif sum(offer.values()) < self._per_probe:
                self._fatal = self._lost_capacity()
        if self._fatal is not None and raise_now:
            raise self._fatal

    def _answer(self, call: Any) -> Any:
        """``call()`` from a daemon thread, or None if it does not return in time."""
        box: list[Any] = []
        thread = threading.Thread(target=lambda: box.append(call()), daemon=True)
        thread.start()
        thread.join(GCS_TIMEOUT_S)
        return box[0] if box else None

    def _lost_gcs(self) -> None:
        self._gone = True
        self._fatal = ExecutorError(
            f"lost the Ray cluster at {self._address}: its head (GCS) has not answered for "
            f"{GCS_TIMEOUT_S:.0f} s; the study is in its storage: continue it with autotune run "
            "--study NAME from a machine that reaches a cluster"
        )

    def _watch(self) -> None:
        while not self._closed.wait(WATCH_PERIOD_S) and self._fatal is None:
            with contextlib.suppress(Exception):
                if self._answer(self._ray.nodes) is None:
                    self._lost_gcs()

    def wait(self, timeout_s: float) -> list[tuple[int, ProbeResult]]:
        if self._fatal is not None and self._gone:
            raise self._fatal  # results of a lost cluster's probes never come
        results = []
        with contextlib.suppress(queue.Empty):
            if self._running:
                results.append(self._results.get(timeout=timeout_s))
            while True:
                results.append(self._results.get_nowait())
        for ticket, _ in results:
            self._running.discard(ticket)
        if not results and self._fatal is not None:
            raise self._fatal
        return results

    def cancel_all(self) -> None:
        """Stop running probes (every rank's process group) and wait for their results."""
        if self._gone:
            return
        for slot in self._slots:
            slot.cancel()
        deadline = time.monotonic() + CANCEL_GRACE_S
        pending: list[tuple[int, ProbeResult]] = []
        while len(pending) < len(self._running) and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                pending.append(self._results.get(timeout=0.5))
        for item in pending:
            self._results.put(item)  # still theirs to collect

    def close(self) -> None:
        self._closed.set()
        if self._gone:
            return  # every call would wait for a GCS that is gone
        from ray.util.placement_group import remove_placement_group

        for slot in self._slots:
            with contextlib.suppress(Exception):  # closing what may already be gone
                slot.close()
        for group in self._groups:
            with contextlib.suppress(Exception):
                remove_placement_group(group)
