"""The cluster mode's rules without a cluster: the address flag, what a cluster must offer,
how probes are laid out over nodes, and the one line a node loss records."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from autotune.cli._flags import PER_RUN, RunFlags
from autotune.errors import ExecutorError, SettingsError
from autotune.execution._cluster import CPU_RANK_RESOURCE, check_offer, slot_layout
from autotune.execution._rank_actor import Placement
from autotune.execution._spanning_slot import _RankLost
from tests.support.cli import run_cli


@pytest.mark.parametrize("address", ["auto", "10.0.0.5:6379", "head-1:6379", "ray://head:10001"])
def test_ray_address_forms_are_taken(address: str) -> None:
    flags = RunFlags.resolve({"workload": "gpt-tiny", "ray_address": address}, {})
    assert flags.settings().probe.ray_address == address


@pytest.mark.parametrize("address", ["head", "head:0", "head:99999", "http://head:6379", "a b:1"])
def test_a_bad_ray_address_is_one_line(address: str) -> None:
    with pytest.raises(SettingsError, match=r"--ray-address .*give auto, HOST:PORT"):
        RunFlags.resolve({"workload": "gpt-tiny", "ray_address": address}, {})


def test_ray_address_needs_the_ray_executor_and_is_not_stored() -> None:
    with pytest.raises(SettingsError, match="drop --executor local"):
        RunFlags.resolve({"workload": "gpt-tiny", "ray_address": "auto", "executor": "local"}, {})
    assert "ray_address" in PER_RUN
    assert "ray_address" not in RunFlags(workload="gpt-tiny", ray_address="auto").stored()


def test_a_cluster_short_of_devices_names_each_node() -> None:
    with pytest.raises(ExecutorError) as caught:
        check_offer({"10.0.0.1": 1, "10.0.0.2": 0}, CPU_RANK_RESOURCE, 2, 2, "10.0.0.1:6379")
    line = str(caught.value)
    assert "\n" not in line
    assert "offers 1 autotune_cpu_rank (10.0.0.1: 1, 10.0.0.2: 0)" in line
    assert "--resources=" in line and "lower --gpus to 1" in line
    check_offer({"a": 4, "b": 4}, "GPU", 8, 8, "x:1")  # enough: no error


@pytest.mark.parametrize(
    ("offer", "total", "per_probe", "expected"),
    [
        ({"a": 8, "b": 8}, 16, 4, (4, "STRICT_PACK")),  # 4-GPU probes stay on one node
        ({"a": 3, "b": 3}, 6, 2, (2, "STRICT_PACK")),  # never split a 2-GPU probe
        ({"a": 8, "b": 8}, 16, 16, (1, "PACK")),  # larger than a node: fewest nodes
        ({"a": 1, "b": 1}, 2, 2, (1, "PACK")),  # the loopback test cluster
        ({"a": 8, "b": 8}, 8, 4, (2, "STRICT_PACK")),  # --gpus caps the slots
    ],
)
def test_slots_are_laid_out_as_production_would_run(
    offer: dict[str, int], total: int, per_probe: int, expected: tuple[int, str]
) -> None:
    assert slot_layout(offer, total, per_probe) == expected


def test_a_lost_node_is_an_error_with_the_node_named() -> None:
    place = Placement(node_id="ab" * 28, node_ip="10.0.0.2", gpu_ids=[])
    lost = _RankLost(1, place, "node left", node_left=True).result()
    assert lost.status == "error" and lost.lost_node == "10.0.0.2"
    assert lost.error.startswith("node lost: rank 1's node 10.0.0.2 (abababababab) left")
    died = _RankLost(0, place, "its Ray actor died (killed)", node_left=False).result()
    assert died.status == "error" and died.lost_node == ""
    assert "its Ray actor died" in died.error


def test_a_head_nobody_answers_at_is_one_line_at_once(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = run_cli(
        "run",
        "--ray-address",
        f"127.0.0.1:{port}",
        "--workload",
        "gpt-tiny",
        "--gpus",
        "2",
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "nothing answers there" in lines[0], done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_loopback_clusters_worker_ports_lie_below_the_ephemeral_range() -> None:
    # Ray's other components bind random ports (port 0), from the kernel's ephemeral range;
    # a worker range holding one of them makes `ray start` fail.
    from autotune.execution.loopback_cluster import WORKER_PORTS_LOW, _worker_port_base

    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        ephemeral_low = int(ports.read().split()[0])
    for nodes in (1, 2, 3):
        for _ in range(200):
            base = _worker_port_base(nodes)
            assert base >= WORKER_PORTS_LOW and base + 100 * nodes <= ephemeral_low
