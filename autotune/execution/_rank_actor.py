"""One rank of a probe on a cluster node: the body of a Ray actor (see
:mod:`autotune.execution._spanning_slot`).

Ray places the actor on one bundle of its slot's placement group, on whichever node holds
that bundle. The actor starts ``python -m autotune.probe.rank --serve INBOX`` with the
rendezvous in its environment (``MASTER_ADDR``/``MASTER_PORT`` of the store the first rank's
actor hosts, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``): the same warm rank a torchrun group
runs, started without ssh, pdsh or a hostfile. Jobs reach it as Ray calls and are posted to
an inbox in the actor's own temporary folder; the rank's report and log go back to the
driver as return values. Nothing is shared on disk between nodes.

The rank's process is in its own process group and dies with the actor's worker (the same
signal-resetting, die-with-parent prelude as torchrun's), so a dead actor or a dead node
leaves no rank behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from autotune.execution._held_folder import HeldFolder
from autotune.execution.launch import (
    _CLEAN_SIGNALS_EXEC,
    ProbeJob,
    kill_process_group,
    prepare_trial_dir,
    probe_env,
    read_tail,
    remove_scratch,
    restore_child_signals,
)
from autotune.protocol import INITIALIZED_MARKER

STOP_GRACE_S = 10.0
POLL_S = 0.05


class Placement(BaseModel):
    """Where Ray put a rank's actor."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_id: str = Field(description="Ray's id of the node (hex).")
    node_ip: str = Field(description="The node's address in the cluster.")
    gpu_ids: list[str] = Field(description="GPUs Ray assigned to the actor (empty on CPU).")


class RankState(BaseModel):
    """A rank's progress on one job, as the driver polls it."""

    model_config = ConfigDict(extra="forbid")

    report: str | None = Field(default=None, description="Its RankReport JSON, once written.")
    exit_code: int | None = Field(
        default=None, description="The rank process's exit code once it has ended."
    )


class RankArtifacts(BaseModel):
    """What a rank leaves of one job, brought back to the driver's trial folder."""

    model_config = ConfigDict(extra="forbid")

    report: str | None = Field(default=None, description="Its RankReport JSON, if written.")
    log: str = Field(default="", description="The rank's output during the job (tail).")
    markers: list[str] = Field(
        default_factory=list,
        description="Marker files the rank left in the job's folder (a script's "
        "``initialized-rank-N``: it reached ``deepspeed.initialize``).",
    )


def interface_of(address: str) -> str | None:
    """The network interface that holds ``address`` (gloo binds the address it resolves)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == address for a in addresses):
            return name
    return None


class RankActor:
    """One probe rank on its node; Ray calls it from the driver's slot thread."""

    def __init__(self) -> None:
        restore_child_signals()  # a Ray worker ignores SIGCHLD: the rank is our child
        self._folder = HeldFolder("autotune-rank-")  # a lost actor's: removed by a later one
        self._home = self._folder.path
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._inbox = self._home
        self._posted = 0
        self._store: Any = None

    def where(self) -> Placement:
        import ray

        context = ray.get_runtime_context()
        gpus = context.get_accelerator_ids().get("GPU", [])
        return Placement(
            node_id=context.get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            gpu_ids=[str(g) for g in gpus],
        )

    def host_store(self, first_port: int, last_port: int) -> int:
        """Start a fresh rendezvous store on this node's cluster address (the first rank's
        node), on the first free port of the range; return the port. Only that address
        listens, not every interface of the node."""
        from datetime import timedelta

        import ray
        import torch.distributed as dist

        from autotune.probe import bound_listener

        self._store = None  # a restarted group never sees the keys of the one before
        address = ray.util.get_node_ip_address()
        for port in range(first_port, last_port + 1):
            with contextlib.suppress(OSError):
                listener = bound_listener(address, port)
                break
        else:
            raise RuntimeError(f"no free rendezvous port in {first_port}-{last_port}")
        self._store = dist.TCPStore(
            address,
            port,
            is_master=True,
            wait_for_workers=False,
            multi_tenant=True,
            timeout=timedelta(minutes=5),
            master_listen_fd=listener.detach(),
        )
        return port

    def start(self, job: ProbeJob, rendezvous: dict[str, str], serve: bool = True) -> int:
        """Start this rank: ``--serve`` a fresh inbox (warm), or probe ``job`` alone."""
        self.kill()
        self._inbox = self._home / f"inbox-{time.monotonic_ns()}"
        self._inbox.mkdir()
        self._posted = 0
        import ray

        env = probe_env(job, rendezvous.get("CUDA_VISIBLE_DEVICES"))
        env.update(rendezvous)
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # clients of the store: none hosts one
        interface = interface_of(ray.util.get_node_ip_address())
        if interface is not None:
            env.setdefault("GLOO_SOCKET_IFNAME", interface)  # gloo's pairs on the cluster IP
        module = (
            "autotune.probe.script_rank" if job.spec.script is not None else "autotune.probe.rank"
        )
        args = ["--serve", str(self._inbox)] if serve else ["--spec", str(self._spec_of(job))]
        self._log = open(self._home / "rank.log", "ab")  # noqa: SIM115 - lives with the rank
        self._process = subprocess.Popen(
            [sys.executable, "-c", _CLEAN_SIGNALS_EXEC, "-u", "-m", module, *args],
            env=env,
            cwd=job.cwd if os.path.isdir(job.cwd) else str(self._home),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self._process.pid

    def _local(self, job: ProbeJob, name: str = "") -> ProbeJob:
        """The job with its folder on this node (the driver's folder may not exist here)."""
        return job.model_copy(update={"trial_dir": str(self._home / "jobs" / (name or "once"))})

    def _spec_of(self, job: ProbeJob) -> Path:
        return prepare_trial_dir(self._local(job))

    def post(self, job: ProbeJob, name: str) -> None:
        """Hand ``job`` to the serving rank (its spec in a folder of this node)."""
        spec_path = prepare_trial_dir(self._local(job, name))
        self._posted += 1
        path = self._inbox / f"job-{self._posted:06d}.json"
        path.with_suffix(".tmp").write_text(json.dumps({"spec": str(spec_path)}), "utf-8")
        os.replace(path.with_suffix(".tmp"), path)  # the rank never reads half a job

    def status(self, name: str, wait_s: float) -> RankState:
        """The rank's report on job ``name`` and whether it still runs, after waiting up to
        ``wait_s`` for either (so the driver's polls are few)."""
        folder = self._home / "jobs" / name
        deadline = time.monotonic() + wait_s
        while True:
            exit_code = self._process.poll() if self._process is not None else -1
            reports = list(folder.glob("rank-*.json"))
            if reports or exit_code is not None or time.monotonic() >= deadline:
                report = reports[0].read_text("utf-8") if reports else None
                return RankState(report=report, exit_code=exit_code)
            time.sleep(POLL_S)

    def collect(self, job: ProbeJob, name: str) -> RankArtifacts:
        """The report and the log of job ``name``; its folder (and scratch) are removed."""
        folder = self._home / "jobs" / name
        reports = sorted(folder.glob("rank-*.json"))
        report = reports[0].read_text("utf-8") if reports else None
        log = read_tail(folder / "probe.log")
        markers = [p.name for p in folder.glob(INITIALIZED_MARKER.format(rank="*"))]
        if self._process is None or self._process.poll() is not None:
            log += read_tail(self._home / "rank.log", 3000)  # what the rank said outside a job
        shutil.rmtree(folder, ignore_errors=True)
        remove_scratch(job)
        return RankArtifacts(report=report, log=log, markers=markers)

    def stop(self) -> None:
        """Ask the serving rank to leave (its peers leave the process group together)."""
        if self._process is not None and self._process.poll() is None:
            self._posted += 1
            (self._inbox / f"job-{self._posted:06d}.json").write_text('{"stop": true}', "utf-8")

    def kill(self, grace_s: float = 0.0) -> None:
        """End the rank's process group (after ``grace_s`` for a rank that was asked to stop)."""
        if self._process is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=grace_s)
        kill_process_group(self._process)
        self._process = None
        if self._log is not None:
            self._log.close()

    def close(self) -> None:
        self.kill()
        self._store = None
        self._folder.remove()
