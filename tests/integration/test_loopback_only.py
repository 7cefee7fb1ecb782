"""A single-machine run listens on loopback only: Ray (GCS, raylet, workers, agents),
the ranks' launcher's store and the ranks' gloo sockets. Whoever reaches Ray's ports can run code,
and a rank's store or pair sockets accept what they are sent.

The listening sockets of the real CLI's process and every descendant are sampled with
psutil while a short study runs (a private Ray, and ``--executor local``)."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from autotune.probe.loopback_run import _loopback_store_factory

pytestmark = pytest.mark.slow


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1, how a dual-stack socket shows IPv4
    return ip.is_loopback


def _listeners(root: psutil.Process) -> set[tuple[str, str, str]]:
    """(process, command, address) of every listening TCP socket in ``root``'s tree."""
    found = set()
    try:
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return found
    for process in tree:
        try:
            command = " ".join(process.cmdline()[:6])
            parent = process.parent()
            if parent is not None and "autotune.probe.fork_ranks" in " ".join(parent.cmdline()):
                command = f"rank forked by {command}"  # a forked rank keeps its parent's
            for conn in process.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add((process.name(), command, conn.laddr.ip))
        except psutil.Error:
            continue
    return found


def _run_sampled(args: list[str], cwd: Path) -> tuple[int, str, set[tuple[str, str, str]]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: set[tuple[str, str, str]] = set()
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(process.pid)
        while not done.is_set():
            seen.update(_listeners(root))
            time.sleep(0.3)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        output, _ = process.communicate(timeout=600)
    finally:
        done.set()
        sampler.join(5)
        if process.poll() is None:
            process.kill()
    return process.returncode, output, seen


@pytest.mark.parametrize("executor", ["ray", "local"])
def test_a_single_machine_run_listens_on_loopback_only(tmp_path: Path, executor: str) -> None:
    code, output, seen = _run_sampled(
        [
            "run",
            "--workload",
            "gpt-tiny",
            "--gpus",
            "2",
            "--executor",
            executor,
            "--budget",
            "10m",
            "--max-trials",
            "2",
            "--no-confirm",
            "--quiet",
            "--warmup-steps",
            "1",
            "--timed-steps",
            "2",
            "--max-timed-steps",
            "2",
            "--seed",
            "0",
        ],
        tmp_path,
    )
    assert code == 0, output[-3000:]
    exposed = sorted(entry for entry in seen if not is_loopback(entry[2]))
    assert exposed == [], f"listening beyond loopback: {exposed}"
    # The sampling saw what it is there to check (so this test can fail).
    commands = " ".join(command for _, command, _ in seen)
    assert "-m autotune.probe.fork_ranks" in commands, seen  # the ranks' launcher and its store
    assert "rank forked by" in commands, seen  # the ranks' gloo sockets
    if executor == "ray":
        names = {name for name, _, _ in seen}
        assert {"gcs_server", "raylet"} <= names, names


def test_a_store_for_a_loopback_host_binds_loopback_only() -> None:
    import torch.distributed as dist

    create = _loopback_store_factory(dist.TCPStore)
    store = create("127.0.0.1", 0, None, True, wait_for_workers=False)
    try:
        ours = [
            c.laddr
            for c in psutil.Process().net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == store.port
        ]
        assert ours and all(is_loopback(address.ip) for address in ours), ours
        store.set("key", "value")
        assert store.get("key") == b"value"
    finally:
        del store
