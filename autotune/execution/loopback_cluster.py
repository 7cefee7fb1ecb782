"""A multi-node Ray cluster on one machine, for trying ``--ray-address`` and for its tests.

``ray start`` runs a head and further nodes on one host when each has its own temporary
folder and worker ports; each node offers ``ranks`` CPU-rank slots (``autotune_cpu_rank``),
as a GPU node offers its GPUs. The nodes use token authentication (Ray's default for new
clusters) with a token of their own, so nothing else on the machine can join or drive them.
:meth:`LoopbackCluster.kill_node` SIGKILLs one node's every process (its raylet, workers,
agents and the probe ranks under them), as a node that dies; :meth:`LoopbackCluster.stop`
ends every process the cluster started, found by its temporary folder (never by name:
other Ray instances on the machine stay up).

    python -m autotune.execution.loopback_cluster --nodes 2 --ranks 1   # prints the address, waits
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from autotune.execution import _priority as priority
from autotune.execution._cluster import CPU_RANK_RESOURCE

WORKER_PORTS_LOW = 10000  # above the ports services usually listen on
# Faster node-death detection than Ray's default (about 15 s), so tests wait seconds.
FAST_HEALTH_CHECKS = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


def _ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _worker_port_base(nodes: int) -> int:
    """The first of the nodes' worker port ranges (100 ports each), below the kernel's
    ephemeral range: the other components of a node bind random ports (port 0) there, and
    ``ray start`` refuses a worker range that holds one of them."""
    ephemeral_low = 32768  # Linux's default net.ipv4.ip_local_port_range
    path = "/proc/sys/net/ipv4/ip_local_port_range"
    with contextlib.suppress(OSError, ValueError, IndexError), open(path) as ports:
        ephemeral_low = int(ports.read().split()[0])
    top = ephemeral_low - 100 * nodes
    if top <= WORKER_PORTS_LOW:  # no room below it: any range, as Ray's own default does
        return random.randrange(WORKER_PORTS_LOW, 60000 - 100 * nodes, 100)
    return random.randrange(WORKER_PORTS_LOW, top, 100)


class LoopbackCluster:
    """``nodes`` Ray nodes on this machine, each offering ``ranks`` CPU ranks."""

    def __init__(self, nodes: int = 2, ranks: int = 1, *, fast_health_checks: bool = True) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="at-ray-", dir="/tmp"))  # short socket paths
        self.nodes, self.ranks = nodes, ranks
        token = self.root / "token"
        token.write_text(uuid.uuid4().hex, encoding="utf-8")
        token.chmod(0o600)
        self.env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_kill_child_processes_on_worker_exit_with_raylet_subreaper": "1",
            # Ray's memory monitor kills the newest worker when the host runs low, whoever
            # uses the memory: a rank's actor, for another program's (or probe's) memory.
            "RAY_memory_monitor_refresh_ms": "0",
            # workers at this process's priority, as production's processes (not Ray's 15)
            priority.RAY_WORKER_NICENESS: str(priority.current()),
            **(FAST_HEALTH_CHECKS if fast_health_checks else {}),
        }
        self.port = _free_port()
        self.address = ""
        self._worker_ports = _worker_port_base(nodes)

    def node_dir(self, index: int) -> Path:
        return self.root / f"node{index}"

    def client_env(self) -> dict[str, str]:
        """The environment a driver needs to join (the cluster's token)."""
        keys = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_USAGE_STATS_ENABLED")
        return {k: self.env[k] for k in keys}

    def start_node(self, index: int) -> None:
        """Start node ``index`` (0: the head)."""
        folder = self.node_dir(index)
        (folder / "tmp").mkdir(parents=True, exist_ok=True)
        low = self._worker_ports + 100 * index
        command = [
            _ray_cli(),
            "start",
            f"--temp-dir={folder}",
            f"--num-cpus={self.ranks}",
            f'--resources={{"{CPU_RANK_RESOURCE}": {self.ranks}}}',
            "--object-store-memory=100000000",
            f"--min-worker-port={low}",
            f"--max-worker-port={low + 99}",
            "--disable-usage-stats",
        ]
        if index == 0:
            command += ["--head", f"--port={self.port}", "--include-dashboard=false"]
        else:
            command += [f"--address={self.address}"]
        # The node's processes keep their temporary files (a rank actor's folder) in the
        # node's folder: they go with it, even when the node is killed.
        env = {**self.env, "TMPDIR": str(folder / "tmp")}
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"ray start failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        if index == 0:
            self.address = f"{_head_ip(done.stdout + done.stderr)}:{self.port}"

    def start(self) -> LoopbackCluster:
        for index in range(self.nodes):
            self.start_node(index)
        return self

    def processes(self, index: int | None = None) -> list[Any]:
        """Every live process of node ``index`` (or of all nodes), with descendants."""
        import psutil

        tag = str(self.node_dir(index)) if index is not None else str(self.root)
        found: dict[int, Any] = {}
        for process in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if process.pid != os.getpid() and any(tag in a for a in process.cmdline()):
                    found[process.pid] = process
                    found.update({c.pid: c for c in process.children(recursive=True)})
        found.pop(os.getpid(), None)
        return list(found.values())

    def node_id(self, index: int) -> str:
        """Ray's id of node ``index`` (hex), from its raylet's command line."""
        for process in self.processes(index):
            for arg in process.cmdline():
                if arg.startswith("--node_id="):
                    return arg.split("=", 1)[1]
        raise RuntimeError(f"node {index} has no live raylet")

    def kill_node(self, index: int) -> int:
        """SIGKILL node ``index``'s every process, as a machine that dies; how many."""
        import psutil

        victims = self.processes(index)
        for process in victims:
            with contextlib.suppress(psutil.Error):
                process.kill()
        return len(victims)

    def stop(self) -> None:
        """End every process of the cluster (by its folder) and remove the folder."""
        import psutil

        for _ in range(3):  # a raylet may start a worker while its siblings die
            victims = self.processes()
            if not victims:
                break
            for process in victims:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            psutil.wait_procs(victims, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LoopbackCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _head_ip(output: str) -> str:
    """The address ``ray start --head`` chose (``Local node IP: 10.0.0.5``)."""
    for line in output.splitlines():
        if "Local node IP:" in line:
            return line.rsplit(":", 1)[1].strip()
    raise RuntimeError(f"ray start --head did not say its address: {output[-1000:]}")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m autotune.execution.loopback_cluster", description=__doc__
    )
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=1, help="CPU ranks per node")
    args = parser.parse_args(argv)
    with LoopbackCluster(args.nodes, args.ranks, fast_health_checks=False) as cluster:
        print(f"--ray-address {cluster.address}")
        print(" ".join(f"{k}={v}" for k, v in cluster.client_env().items()))
        print("Ctrl-C stops every node", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
