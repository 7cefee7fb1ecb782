"""Probes on an existing Ray cluster (``--ray-address``), tested on one machine.

Two Ray nodes started with ``ray start`` (a head and a worker, each with its own temporary
folder and one CPU-rank slot: :class:`autotune.execution.loopback_cluster.LoopbackCluster`), so
every
2-rank probe spans both. The driver always runs in a subprocess (the real CLI, or a short
script): it joins the cluster with the cluster's own token. Each cluster is torn down by
its folder, whatever the outcome, never with ``ray stop`` (which would stop every Ray on
the machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.execution.loopback_cluster import LoopbackCluster
from tests.support.paths import ROOT
from tests.support.probe_jobs import nodes_of
from tests.support.processes import probe_processes

pytestmark = pytest.mark.slow

STUDY_FLAGS = [
    "--workload",
    "gpt-tiny",
    "--gpus",
    "2",
    "--budget",
    "10m",
    "--no-confirm",
    "--quiet",
    "--warmup-steps",
    "1",
    "--timed-steps",
    "2",
    "--max-timed-steps",
    "3",
    "--seed",
    "0",
]


@pytest.fixture
def cluster() -> Iterator[LoopbackCluster]:
    """A cluster of its own, for a test that kills a node of it."""
    with LoopbackCluster(nodes=2, ranks=1) as started:
        yield started


@pytest.fixture(scope="class")
def shared_cluster() -> Iterator[LoopbackCluster]:
    """One cluster for the tests of a class (:class:`TestOnOneCluster`)."""
    with LoopbackCluster(nodes=2, ranks=1) as started:
        yield started


def _env(cluster: LoopbackCluster) -> dict[str, str]:
    return {**os.environ, **cluster.client_env(), "PYTHONPATH": str(ROOT)}


def _cli(cluster: LoopbackCluster, cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", "run", "--ray-address", cluster.address, *args],
        cwd=cwd,
        env=_env(cluster),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _trials(cwd: Path) -> list[dict[str, object]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.load_study(study_name="gpt-tiny", storage=f"sqlite:///{cwd}/trials/autotune.db")
    # a trial Optuna queued to probe again is not a trial of this run yet
    return [
        {"number": t.number, "state": t.state.name, **t.user_attrs}
        for t in study.trials
        if t.state.name != "WAITING"
    ]


WORLD_SPACE = """\
precision: [fp32]
zero_stage: [0]
offload_optimizer: [none]
offload_param: [none]
micro_batch_size: [4]
activation_checkpointing: [false]
"""

SPANNING_PROBES = """
import json, sys
import psutil
from pathlib import Path
from autotune.execution._cluster import ClusterExecutor
from autotune.protocol import RankReport
from tests.support.probe_jobs import make_job

out = Path(sys.argv[2])
executor = ClusterExecutor(
    address=sys.argv[1], total_devices=2, devices_per_probe=2, cuda=False, warm=True
)
rows = []
try:
    for name in ("a", "b"):
        executor.submit(make_job(out).model_copy(update={"trial_dir": str(out / name)}))
        results = []
        while not results:
            results = executor.wait(1.0)
        result = results[0][1]
        pids = sorted(
            RankReport.model_validate_json(p.read_text()).pid for p in (out / name).glob("rank-*")
        )
        nice = [psutil.Process(pid).nice() for pid in pids]  # the warm ranks, still serving
        rows.append({"status": result.status, "error": result.error, "log": result.log_tail,
                     "steps": len(result.step_times_s), "cold": result.cold_start, "pids": pids,
                     "nice": nice, "nodes": result.node_per_rank,
                     "host_method": result.host_peak_method,
                     "per_node": result.host_peak_per_node()})
finally:
    executor.close()
print(json.dumps(rows))
"""


class TestOnOneCluster:
    """Tests that leave the cluster as they found it share one (their drivers end, and Ray
    releases what a finished driver held): each start of two nodes costs ~15 s."""

    def test_a_probe_spans_two_nodes_and_its_ranks_stay_warm(
        self, shared_cluster: LoopbackCluster, tmp_path: Path
    ) -> None:
        cluster = shared_cluster
        done = subprocess.run(
            [sys.executable, "-c", SPANNING_PROBES, cluster.address, str(tmp_path)],
            env=_env(cluster),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        first, second = json.loads(done.stdout.strip().splitlines()[-1])
        assert first["status"] == "ok", first["error"] + first["log"]
        assert second["status"] == "ok", second["error"] + second["log"]
        assert first["steps"] == 3 and first["cold"] and not second["cold"]
        assert first["pids"] == second["pids"] and len(first["pids"]) == 2  # the same warm ranks
        # at the driver's priority (this test's), not at the nice 15 of Ray's workers
        assert first["nice"] == [os.getpriority(os.PRIO_PROCESS, 0)] * 2, first["nice"]
        for name in ("a", "b"):  # what a torchrun probe leaves, in the driver's folder
            names = {p.name for p in (tmp_path / name).iterdir()}
            assert {
                "spec.json",
                "ds_config.json",
                "rank-0.json",
                "rank-1.json",
                "probe.log",
            } <= names
            assert len(nodes_of(tmp_path / name)) == 2  # one rank on each node
        for row, name in ((first, "a"), (second, "b")):
            # each rank names its own node, so host memory is summed per node
            ids = {node.split("(node ")[1].rstrip(")") for node in row["nodes"]}
            assert ids == nodes_of(tmp_path / name), row["nodes"]
            assert len(row["per_node"]) == 2 and row["host_method"] == "kernel_hwm"
        assert _no_probe_left() == []

    def test_a_study_through_the_cluster_completes_and_exports(
        self, shared_cluster: LoopbackCluster, tmp_path: Path
    ) -> None:
        cluster = shared_cluster
        run = _cli(cluster, tmp_path, *STUDY_FLAGS, "--max-trials", "6")
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, out[-3000:] + err[-3000:]
        assert "exported:" in out
        assert (tmp_path / "trials" / "gpt-tiny" / "best" / "ds_config.json").is_file()
        probed = [t for t in _trials(tmp_path) if "probe_wall_s" in t]
        assert len(probed) >= 6 and all(t["status"] == "ok" for t in probed), probed
        for trial in probed:
            folder = Path(str(trial["trial_dir"]))
            assert (folder / "rank-0.json").is_file() and (folder / "rank-1.json").is_file()
            assert len(nodes_of(folder)) == 2

    def test_world_sizes_searched_on_the_cluster_pack_onto_whole_nodes(
        self, shared_cluster: LoopbackCluster, tmp_path: Path
    ) -> None:
        """``--gpus 1-2`` on two nodes of one rank: a 1-rank probe runs on one node, a
        2-rank probe spans both, each at the same global batch; the cost objective
        decides among them."""
        cluster = shared_cluster
        (tmp_path / "space.yaml").write_text(WORLD_SPACE)
        flags = [*STUDY_FLAGS[:2], "--gpus", "1-2", "--space", "space.yaml", "--global-batch",
                 "8", *STUDY_FLAGS[4:], "--objective", "cost", "--gpu-hour-price", "1"]  # fmt: skip
        run = _cli(cluster, tmp_path, *flags)
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, out[-3000:] + err[-3000:]
        probed = [t for t in _trials(tmp_path) if "probe_wall_s" in t]
        sizes = {}
        for trial in probed:
            candidate = trial["candidate"]
            assert trial["status"] == "ok", trial
            ranks = candidate["data_parallel_size"]
            assert (
                candidate["micro_batch_size"] * candidate["gradient_accumulation_steps"] * (ranks)
                == 8
            )
            sizes[ranks] = len(nodes_of(Path(str(trial["trial_dir"]))))
        assert sizes == {1: 1, 2: 2}  # one node, then both
        rates = {t["number"]: t["samples_per_s"] / t["candidate"]["data_parallel_size"]
                 for t in probed}  # fmt: skip
        best = json.loads(
            subprocess.run(
                [sys.executable, "-m", "autotune.cli", "status", "--json"],
                cwd=tmp_path, env=_env(cluster), capture_output=True, text=True, check=True,
            ).stdout
        )["best"]  # fmt: skip
        assert best["trial"] == max(rates, key=rates.__getitem__)  # per GPU, the cheapest

    def test_a_cluster_without_the_devices_asked_for_says_what_is_missing(
        self, shared_cluster: LoopbackCluster, tmp_path: Path
    ) -> None:
        cluster = shared_cluster
        flags = [*STUDY_FLAGS[:2], "--gpus", "4", "--gpus-per-trial", "2", "--max-trials", "1"]
        run = _cli(cluster, tmp_path, *flags)
        out, err = run.communicate(timeout=300)
        assert run.returncode == 2, out + err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "--gpus 4: the Ray cluster at" in lines[0], err
        assert "offers 2 autotune_cpu_rank (" in lines[0] and "lower --gpus to 2" in lines[0]


def _no_probe_left(timeout_s: float = 30.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while probe_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    return probe_processes()


def _kill_when_probing(
    cluster: LoopbackCluster, run: subprocess.Popen[str], node: int, trial: int
) -> tuple[str, str]:
    """Kill ``node`` once trial ``trial``'s probe runs (its ranks are up); the run's output."""
    assert run.stdout is not None
    lines = []
    for line in run.stdout:
        lines.append(line)
        if line.startswith(f"trial {trial}: probing"):
            time.sleep(2.0)  # into the probe
            assert cluster.kill_node(node) > 0
    out = "".join(lines)
    return out, run.stderr.read() if run.stderr else ""


def test_a_node_killed_mid_probe_costs_that_trial_only(
    cluster: LoopbackCluster, tmp_path: Path
) -> None:
    run = _cli(cluster, tmp_path, *STUDY_FLAGS, "--max-trials", "6")
    out, err = _kill_when_probing(cluster, run, node=1, trial=1)
    run.wait(timeout=300)
    # The cluster can no longer hold a 2-rank probe: the run stops with one line.
    assert run.returncode == 2, out[-3000:] + err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "lost nodes" in lines[0] and "a probe needs 2" in lines[0], err
    # The probe the kill hit is the one lost; those before it are measured; none is left
    # RUNNING (no trial is asked once the cluster cannot hold a probe).
    *measured, lost = _trials(tmp_path)
    assert measured and all(t["state"] == "COMPLETE" and t["status"] == "ok" for t in measured)
    # the node, not the candidate, failed: recorded interrupted and queued once more
    assert lost["state"] == "FAIL" and lost["status"] == "interrupted", lost
    assert str(lost["error"]).startswith("node lost: rank "), lost["error"]
    assert "left the Ray cluster during the probe" in str(lost["error"])
    assert _no_probe_left() == []


def test_a_node_lost_mid_probe_is_replaced_and_the_study_goes_on(tmp_path: Path) -> None:
    """Three one-rank nodes, probes of two: when a node of the probe dies, that probe is
    lost, Ray re-places its rank on the third node and the study completes."""
    with LoopbackCluster(nodes=3, ranks=1) as cluster:
        run = _cli(cluster, tmp_path, *STUDY_FLAGS, "--max-trials", "5")
        assert run.stdout is not None and run.stderr is not None
        lines, victim = [], ""
        for line in run.stdout:
            lines.append(line)
            if line.startswith("trial 1: probing"):
                used = nodes_of(tmp_path / "trials" / "gpt-tiny" / "trial-0000")
                index = next(i for i in (1, 2) if cluster.node_id(i)[:8] in used)
                victim = cluster.node_id(index)[:8]
                time.sleep(2.0)  # into the probe
                assert cluster.kill_node(index) > 0
        run.wait(timeout=300)
        out, err = "".join(lines), run.stderr.read()
    assert run.returncode == 0, out[-3000:] + err[-3000:]
    assert victim and "exported:" in out
    trials = [t for t in _trials(tmp_path) if "trial_dir" in t]
    lost = [t for t in trials if t["status"] == "interrupted"]
    assert len(lost) == 1 and str(lost[0]["error"]).startswith("node lost: "), trials
    # probed again once, on the nodes left
    lost_number = next(
        i
        for i, t in enumerate(_trials(tmp_path))
        if t is not None and t.get("status") == "interrupted"
    )
    retries = [t for t in trials if t.get("retry_of") == lost_number]
    assert len(retries) == 1 and retries[0]["status"] == "ok", trials
    later = [t for t in trials if str(t["trial_dir"]) > str(lost[0]["trial_dir"])]
    assert later and all(t["status"] == "ok" for t in later), later
    for trial in later:  # two nodes again, neither of them the dead one
        nodes = nodes_of(Path(str(trial["trial_dir"])))
        assert len(nodes) == 2 and victim not in nodes, nodes


def test_a_driver_that_loses_the_cluster_stops_with_one_line(
    cluster: LoopbackCluster, tmp_path: Path
) -> None:
    run = _cli(cluster, tmp_path, *STUDY_FLAGS, "--max-trials", "6")
    out, err = _kill_when_probing(cluster, run, node=0, trial=1)
    run.wait(timeout=300)
    assert run.returncode == 2, out[-3000:] + err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune: error: lost the Ray cluster"), err
    assert "continue it with autotune run --study" in lines[0]
    assert _trials(tmp_path)[0]["status"] == "ok"  # what was measured stays in the study
