"""A slot whose probe's ranks may live on several nodes: the driver's side of a spanning probe.

A slot holds a Ray placement group of K bundles (one device each) and one
:class:`~autotune.execution._rank_actor.RankActor` per bundle, on the node Ray placed it. The slot
does
for its ranks what torchrun does on one host:

- ranks in node order (the first bundle's node first, each node's ranks contiguous), with
  ``LOCAL_RANK`` within the node and the node's GPUs of the probe as ``CUDA_VISIBLE_DEVICES``;
- the rendezvous: the first rank's actor hosts a fresh store on its node's cluster address
  (a port of :data:`RENDEZVOUS_PORTS`); every rank is a client (``MASTER_ADDR``/``PORT``);
- warm ranks: each serves job after job; a failed, hung, cancelled or unclean probe restarts
  the group (as :class:`~autotune.execution._worker.WarmWorker` does);
- when one rank fails the others are given a moment to report, then all are stopped;
- the ranks' reports and logs come back as Ray return values into the driver's trial
  folder, and :func:`~autotune.rank_outcome.aggregate` folds them into the same ProbeResult a
  torchrun probe gives.

A rank whose node leaves the cluster ends the probe as ``error`` with ``lost_node`` set
("node lost: ..."): it measured nothing about the candidate. Ray re-places the lost bundle
on another node if one has the resource; the slot starts a new actor there before its next
probe, or reports :class:`Unplaced`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from autotune.execution._rank_actor import Placement, RankArtifacts, RankState
from autotune.execution._script_outcome import again_cold, explain
from autotune.execution.launch import ProbeJob, group_shape, prepare_trial_dir, unclean_bytes
from autotune.protocol import NODE_ENV, ProbeResult, RankReport
from autotune.rank_outcome import aggregate

RENDEZVOUS_PORTS = (29500, 29999)  # the first rank's store: open between the nodes
PLACEMENT_TIMEOUT_S = 60.0  # for Ray to start a rank's actor on its bundle
# A rank's actor that does not answer a call (post, start, collect: CALL_TIMEOUT_S) or any
# status poll (SILENT_LIMIT_S) this long, on a node still in the cluster, is taken as lost.
# A lost node is noticed apart from these (its health checks). On a node whose cores are
# oversubscribed (a build beside three drivers and their ranks on two cores) a live actor
# went a minute without answering: these limits are for a hung actor, not a busy one.
CALL_TIMEOUT_S = 180.0
POLL_WAIT_S = 0.5  # each status call waits this long for news
PEER_GRACE_S = 10.0  # after one rank failed: for its peers to report before they are killed
SILENT_LIMIT_S = 180.0
NODE_VERDICT_S = 45.0  # for the cluster to declare a node dead (Ray's default checks: ~15 s)


class Unplaced(Exception):
    """Ray did not start a rank's actor within the placement timeout (its bundle has no node)."""


class ActorFailed(Exception):
    """A rank's actor died as Ray started it; the next probe starts a new one."""


class _RankLost(Exception):
    """A rank's actor is gone or silent; ``node_left``: because its node left the cluster."""

    def __init__(self, rank: int, place: Placement | None, why: str, node_left: bool) -> None:
        super().__init__(why)
        self.rank, self.place, self.why, self.node_left = rank, place, why, node_left

    def result(self) -> ProbeResult:
        where = f"node {self.place.node_ip} ({self.place.node_id[:12]})" if self.place else "?"
        if self.node_left:
            return ProbeResult(
                status="error",
                error=f"node lost: rank {self.rank}'s {where} left the Ray cluster during the "
                "probe; nothing was measured, the candidate may be probed again on other nodes",
                lost_node=self.place.node_ip if self.place else "unknown",
            )
        return ProbeResult(
            status="error", error=f"rank {self.rank} on {where}: {self.why}; the probe was stopped"
        )


class SpanningSlot:
    """One probe at a time on K ranks placed by a placement group (see the module doc)."""

    def __init__(
        self, ray: Any, group: Any, bundles: int, actor_options: dict[str, Any], warm: bool
    ) -> None:
        from autotune.execution._rank_actor import RankActor

        self._ray = ray
        self._group = group
        self._actor_class = ray.remote(RankActor)
        self._actor_options = actor_options
        self._actors: list[Any] = [None] * bundles
        self._places: list[Placement | None] = [None] * bundles
        self._order: list[int] = []  # bundle of each rank
        self._shape: tuple[object, ...] | None = None
        self.warm = warm
        self.script_warm = True  # a script's probes run warm until a warm run fails alone
        self._serving = False  # the ranks serve posted jobs (else they probe one job alone)
        self._jobs = 0
        self._cancel = threading.Event()
        self._lock = threading.Lock()

    # -- placement ------------------------------------------------------------------
    def _ensure_actors(self) -> None:
        """An actor on every bundle (again after a node loss); raises Unplaced."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        refs = {}
        for bundle, actor in enumerate(self._actors):
            if actor is None:
                strategy = PlacementGroupSchedulingStrategy(
                    self._group, placement_group_bundle_index=bundle
                )
                options = {**self._actor_options, "scheduling_strategy": strategy}
                actor = self._actor_class.options(**options).remote()
                self._actors[bundle] = actor
            if self._places[bundle] is None:
                refs[actor.where.remote()] = bundle
        if not refs:
            return
        ready, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=PLACEMENT_TIMEOUT_S)
        if len(ready) < len(refs):
            raise Unplaced(
                f"Ray did not place {len(refs) - len(ready)} rank(s) of a probe within "
                f"{PLACEMENT_TIMEOUT_S:.0f} s (no node with a free device left)"
            )
        try:
            for ref in ready:
                self._places[refs[ref]] = self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:  # e.g. killed by Ray's memory monitor
            placed = zip(self._actors, self._places, strict=True)
            self._actors = [actor if place else None for actor, place in placed]  # anew next time
            cause = (str(exc).strip().splitlines() or [""])[0][:300]
            raise ActorFailed(f"a rank's Ray actor died as it started ({cause})") from None
        self._shape = None  # new ranks: the group starts afresh
        nodes = list(dict.fromkeys(p.node_id for p in self._places if p is not None))
        self._order = sorted(
            range(len(self._places)),
            key=lambda b: (nodes.index(self._places[b].node_id), b),  # type: ignore[union-attr]
        )

    def _rendezvous(self, world_size: int, port: int, cuda: bool) -> list[dict[str, str]]:
        """Each rank's environment: rank, node-local rank, devices, the store's address."""
        ranks = self._order[:world_size]
        places = [self._places[b] for b in ranks]
        master = places[0].node_ip  # type: ignore[union-attr]
        envs = []
        for rank, place in enumerate(places):
            assert place is not None
            local = [p for p in places if p is not None and p.node_id == place.node_id]
            env = {
                "MASTER_ADDR": master,
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(local.index(place)),
                "LOCAL_WORLD_SIZE": str(len(local)),
                NODE_ENV: node_name(place),  # the node whose host RAM the rank uses
            }
            if cuda:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(g for p in local for g in p.gpu_ids)
            envs.append(env)
        return envs

    # -- one probe ------------------------------------------------------------------
    def run(self, job: ProbeJob) -> ProbeResult:
        """Probe ``job`` on the slot's ranks; never raises for what the probe did. Raises
        Unplaced when a rank's actor cannot be placed."""
        with self._lock:
            self._cancel.clear()
            self._ensure_actors()
            started = time.perf_counter()
            try:
                shape = group_shape(job)
                cold = self._shape != shape or not self._serves(job)
                result, leaked = self._attempt(job, cold)
                if leaked:  # the warm ranks refused it: probe it again in a fresh group
                    result, _ = self._attempt(job, cold=True)
                    result.leak_restart_bytes = leaked
                elif job.spec.script is not None and not cold and result.status == "error":
                    result = self._script_again_cold(job, result)
                if not self.warm or not self._serves(job):
                    self._stop_group(grace_s=5.0)
                return result
            except _RankLost as lost:
                self._stop_group(grace_s=0.0)
                for bundle, place in enumerate(self._places):
                    if lost.place is None or place is None or place.node_id == lost.place.node_id:
                        self._actors[bundle] = self._places[bundle] = None  # placed anew
                result = lost.result()
                result.wall_s = time.perf_counter() - started
                _write_spec(job)
                (Path(job.trial_dir) / "probe.log").write_text(result.error + "\n", "utf-8")
                return result

    def _serves(self, job: ProbeJob) -> bool:
        """Whether ``job``'s ranks serve job after job: a built-in probe's always (a cold
        slot stops them after each), a script's while warm runs of it measure."""
        return job.spec.script is None or (self.warm and self.script_warm)

    def _script_again_cold(self, job: ProbeJob, warm: ProbeResult) -> ProbeResult:
        """A script's warm run failed: probe it again cold (:func:`again_cold`); where that
        one measures, the script's later probes are cold launches."""
        if self._cancel.is_set():
            return warm
        cold = again_cold(warm, lambda: self._attempt(job, cold=True)[0])
        if cold.warm_fallback:
            self.script_warm = False
        return cold

    def _ranks(self, world_size: int) -> list[Any]:
        return [self._actors[b] for b in self._order[:world_size]]

    def _start_group(self, job: ProbeJob) -> None:
        self._stop_group(grace_s=0.0)
        cuda = job.spec.accelerator == "cuda"
        first = self._actors[self._order[0]]
        port = self._call([first.host_store.remote(*RENDEZVOUS_PORTS)], "host_store")[0]
        envs = self._rendezvous(job.world_size, port, cuda)
        serve = self._serves(job)
        ranks = self._ranks(job.world_size)
        starts = [a.start.remote(job, env, serve) for a, env in zip(ranks, envs, strict=True)]
        self._call(starts, "start")
        self._shape = group_shape(job)
        self._serving = serve

    def _attempt(self, job: ProbeJob, cold: bool) -> tuple[ProbeResult, int]:
        """Probe ``job`` once (in a fresh group if ``cold``): the result, and the bytes of
        earlier candidates the warm ranks found still allocated if they refused it."""
        if cold:
            self._start_group(job)
        ranks = self._ranks(job.world_size)
        name = f"job-{self._jobs:06d}" if self._serving else "once"
        self._jobs += 1
        if self._serving:
            self._call([a.post.remote(job, name) for a in ranks], "post")
        started = time.perf_counter()
        states, timed_out, cancelled = self._watch(ranks, name, started + job.timeout_s)
        reports = _reports(states)
        healthy = len(reports) == job.world_size and all(r.status == "ok" for r in reports)
        healthy = healthy and not timed_out and not cancelled
        if not healthy:
            if not timed_out and not cancelled:
                states = self._settle(ranks, name)
            self._stop_group(grace_s=0.0)
        artifacts = self._call([a.collect.remote(job, name) for a in ranks], "collect")
        reports = _reports(artifacts)
        codes = [s.exit_code for s in states if s.exit_code not in (None, 0)]
        log_tail = _write_artifacts(job, artifacts, states, self._placements(job.world_size))
        result = aggregate(
            job.spec,
            reports,
            world_size=job.world_size,
            exit_code=0 if healthy else (codes[0] if codes else None),
            timed_out=timed_out,
            wall_s=time.perf_counter() - started,
            log_tail=log_tail,
        )
        result.cold_start = cold
        if cancelled:
            result = ProbeResult(status="error", error="cancelled: the run was interrupted")
        elif job.spec.script is not None:
            result = explain(job, result)
        return result, 0 if cancelled or cold else unclean_bytes(reports)

    def _placements(self, world_size: int) -> list[Placement | None]:
        return [self._places[b] for b in self._order[:world_size]]

    def _watch(
        self, ranks: list[Any], name: str, deadline: float
    ) -> tuple[list[RankState], bool, bool]:
        """Poll until every rank reported ok, one failed or ended, the deadline passed or
        the slot was cancelled: the last states, timed out, cancelled."""
        while True:
            states = self._poll(ranks, name)
            reports = _reports(states)
            if len(reports) == len(ranks) or any(r.status != "ok" for r in reports):
                return states, False, False
            if any(s.exit_code is not None for s in states):
                return states, False, False
            if time.perf_counter() > deadline:
                return states, True, False
            if self._cancel.is_set():
                return states, False, True

    def _settle(self, ranks: list[Any], name: str) -> list[RankState]:
        """After a failure: the ranks' states once each reported or ended, or after
        :data:`PEER_GRACE_S` (a rank blocked in a collective is killed then)."""
        deadline = time.perf_counter() + PEER_GRACE_S
        while True:
            states = self._poll(ranks, name)
            if all(s.report is not None or s.exit_code is not None for s in states):
                return states
            if time.perf_counter() > deadline:
                return states

    def _poll(self, ranks: list[Any], name: str) -> list[RankState]:
        """Every rank's state; raises _RankLost when a rank's actor died (with its node or
        not) or stayed silent for :data:`SILENT_LIMIT_S`."""
        ray = self._ray
        refs = [a.status.remote(name, POLL_WAIT_S) for a in ranks]
        silent_since = time.monotonic()
        while True:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=POLL_WAIT_S + 5.0)
            for rank, ref in enumerate(refs):
                if ref in ready:
                    self._get_or_lost(ref, rank)
            if len(ready) == len(refs):
                return [ray.get(ref) for ref in refs]
            silent = [rank for rank, ref in enumerate(refs) if ref not in ready]
            for rank in silent:
                place = self._placements(len(ranks))[rank]
                if place is not None and not _node_alive(ray, place.node_id):
                    raise _RankLost(rank, place, "its node left the cluster", node_left=True)
            if time.monotonic() - silent_since > SILENT_LIMIT_S:
                place = self._placements(len(ranks))[silent[0]]
                why = f"its Ray actor did not answer a status poll for {SILENT_LIMIT_S:.0f} s"
                raise _RankLost(silent[0], place, why, node_left=False)

    def _get_or_lost(self, ref: Any, rank: int) -> Any:
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as exc:  # the actor died (or its worker was killed)
            place = self._placements(len(self._order))[rank]
            # An actor whose node dies is "unavailable" until the cluster declares the node
            # dead (its health checks take seconds): wait for that verdict.
            waits = isinstance(exc, ray.exceptions.ActorUnavailableError)
            deadline = time.monotonic() + (NODE_VERDICT_S if waits else 0.0)
            while place is not None:
                if not _node_alive(ray, place.node_id):
                    raise _RankLost(rank, place, "node left", node_left=True) from None
                if time.monotonic() >= deadline:
                    break
                time.sleep(1.0)
            cause = (str(exc).strip().splitlines() or [""])[0][:200]
            raise _RankLost(rank, place, f"its Ray actor died ({cause})", node_left=False) from None

    def _call(self, refs: list[Any], method: str) -> list[Any]:
        """Results of calls (of actor ``method``) that must answer; an actor that died or
        did not answer raises _RankLost."""
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=CALL_TIMEOUT_S)
        ranks = {ref: rank for rank, ref in enumerate(refs)}
        for ref in refs:
            if ref not in ready:
                place = self._placements(len(self._order))[ranks[ref]]
                left = place is not None and not _node_alive(self._ray, place.node_id)
                why = f"its Ray actor did not answer {method} for {CALL_TIMEOUT_S:.0f} s"
                raise _RankLost(ranks[ref], place, why, node_left=left)
        return [self._get_or_lost(ref, ranks[ref]) for ref in refs]

    def _stop_group(self, grace_s: float) -> None:
        """Stop every rank (ask first when ``grace_s``); dead actors are skipped."""
        live = [a for a in self._actors if a is not None]
        if grace_s:
            self._ray.wait([a.stop.remote() for a in live], num_returns=len(live), timeout=5)
        refs = [a.kill.remote(grace_s) for a in live]
        self._ray.wait(refs, num_returns=len(refs), timeout=grace_s + 15)
        self._shape = None

    def cancel(self) -> None:
        """Make a running :meth:`run` stop its ranks and return (thread-safe)."""
        self._cancel.set()

    def close(self) -> None:
        live = [a for a in self._actors if a is not None]
        refs = [a.close.remote() for a in live]
        self._ray.wait(refs, num_returns=len(refs), timeout=15)
        for actor in live:
            self._ray.kill(actor)
        self._actors = [None] * len(self._actors)


def node_name(place: Placement) -> str:
    """How a rank's report names its node: the node's address and Ray's id (several nodes
    of a loopback cluster share an address)."""
    return f"{place.node_ip} (node {place.node_id[:8]})"


def _node_alive(ray: Any, node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())


def _reports(states: list[RankState] | list[RankArtifacts]) -> list[RankReport]:
    return [RankReport.model_validate_json(s.report) for s in states if s.report is not None]


def _write_spec(job: ProbeJob) -> None:
    prepare_trial_dir(job.model_copy(update={"scratch_dir": None}))  # the driver has none


def _write_artifacts(
    job: ProbeJob,
    artifacts: list[RankArtifacts],
    states: list[RankState],
    places: list[Placement | None],
) -> str:
    """The probe's folder on the driver, as a torchrun probe leaves it: spec, config, a
    report per rank, one probe.log (each rank's part under a header); returns its tail."""
    from autotune.execution.launch import LOG_TAIL_CHARS

    _write_spec(job)
    folder = Path(job.trial_dir)
    parts, endings = [], []
    for rank, (artifact, state, place) in enumerate(zip(artifacts, states, places, strict=True)):
        where = node_name(place) if place else "?"
        if artifact.report is not None:
            (folder / f"rank-{rank}.json").write_text(artifact.report, encoding="utf-8")
        for marker in artifact.markers:  # what the driver's reading of a failure looks for
            (folder / Path(marker).name).touch()
        parts.append(f"===== rank {rank} on {where} =====\n{artifact.log.rstrip()}\n")
        if artifact.report is None and state.exit_code is not None:
            # last, where the error of a rank that died without a word is read from
            endings.append(f"rank {rank} on {where} ended with exit code {state.exit_code}\n")
    log = "".join(parts + endings)
    (folder / "probe.log").write_text(log, encoding="utf-8")
    return log[-LOG_TAIL_CHARS:]
