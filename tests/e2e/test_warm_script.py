"""A user's script probed in warm ranks (``autotune run --script``): its ``__main__`` run
again in the same processes for each candidate, the interpreter, imports and process group
paid once; a script that cannot run twice in one process falls back to cold launches with
one line, every probe still measured. The same on this machine (torchrun, a Ray actor's
slot) and on a Ray cluster, whose probes span its two nodes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from autotune.execution.loopback_cluster import LoopbackCluster
from tests.e2e.faults.conftest import assert_no_probe_left
from tests.support.cli import run_cli
from tests.support.paths import ASSETS, ROOT
from tests.support.probe_jobs import nodes_of

pytestmark = pytest.mark.slow

SCRIPT = ASSETS / "tiny_script.py"
SPACE = "precision: [fp32]\nzero_stage: [0, 1]\nmicro_batch_size: [2, 4]\n"
FAST = [
    "--warmup-steps", "1", "--timed-steps", "2", "--max-timed-steps", "2",
    "--no-early-stop", "--no-confirm", "--sampler", "grid",
]  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[LoopbackCluster]:
    """Two Ray nodes of one CPU rank each: every 2-rank probe spans both."""
    with LoopbackCluster(nodes=2, ranks=1) as started:
        yield started


def _study(
    tmp_path: Path, mode: str, executor: str = "local", cluster: LoopbackCluster | None = None
) -> tuple[str, list[dict]]:
    (tmp_path / "space.yaml").write_text(SPACE)
    joins: list[str] = ["--ray-address", cluster.address] if cluster else []
    env = {**cluster.client_env(), "PYTHONPATH": str(ROOT)} if cluster else None
    result = run_cli(
        "run", "--script", str(SCRIPT), "--gpus", "2", "--space", "space.yaml",
        "--global-batch", "8", "--max-trials", "3", "--budget", "5m", *FAST,
        "--executor", executor, *joins, "--", mode, cwd=tmp_path, env=env,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback" not in output, output
    study = optuna.load_study(
        study_name="tiny_script", storage=f"sqlite:///{tmp_path}/trials/autotune.db"
    )
    trials = [t.user_attrs for t in study.trials if "probe_wall_s" in t.user_attrs]
    return output, trials


@pytest.mark.parametrize(
    ("mode", "executor"), [("train", "local"), ("own_init", "local"), ("train", "ray")]
)
def test_a_scripts_later_probes_run_in_its_warm_ranks(
    tmp_path: Path, mode: str, executor: str
) -> None:
    """``own_init``: the script calls ``init_process_group`` itself, which the warm ranks'
    kept group answers on every run after the first; ``ray``: the warm group inside a Ray
    actor's slot, as the default executor runs it."""
    output, trials = _study(tmp_path, mode, executor)
    assert [t["status"] for t in trials] == ["ok"] * 3, output
    assert [t.get("probe_cold_start", False) for t in trials] == [True, False, False], output
    assert "cold launches from here on" not in output
    assert_no_probe_left()


def test_a_script_that_cannot_run_twice_falls_back_to_cold_launches(tmp_path: Path) -> None:
    output, trials = _study(tmp_path, "once")
    assert [t["status"] for t in trials] == ["ok"] * 3, output  # never measured wrong
    assert [t.get("probe_cold_start", False) for t in trials] == [True, True, True], output
    lines = [line for line in output.splitlines() if "cold launches from here on" in line]
    assert len(lines) == 1 and lines[0].startswith("trial 1:"), output
    assert "tiny_script.py cannot run twice in one process" in lines[0]
    assert_no_probe_left()


@pytest.mark.parametrize("mode", ["train", "once"])
def test_on_a_ray_cluster_a_scripts_probes_span_its_nodes_warm(
    tmp_path: Path, cluster: LoopbackCluster, mode: str
) -> None:
    """``--script`` with ``--ray-address``: each probe's two ranks on the cluster's two
    nodes, later probes in the same warm ranks; ``once`` falls back to cold launches on
    the cluster as on one machine."""
    output, trials = _study(tmp_path, mode, "ray", cluster)
    assert [t["status"] for t in trials] == ["ok"] * 3, output
    for trial in trials:
        assert len(nodes_of(Path(trial["trial_dir"]))) == 2, trial["trial_dir"]
    cold = [t.get("probe_cold_start", False) for t in trials]
    fallbacks = [line for line in output.splitlines() if "cold launches from here on" in line]
    if mode == "train":
        assert cold == [True, False, False] and not fallbacks, output
    else:
        assert cold == [True, True, True], output
        assert len(fallbacks) == 1 and fallbacks[0].startswith("trial 1:"), output
    assert_no_probe_left()


def test_on_a_ray_cluster_a_script_missing_on_a_node_is_one_line(
    tmp_path: Path, cluster: LoopbackCluster
) -> None:
    """Every node must hold the script at the driver's path: checked on each live node
    before anything is written (here, a path no node has)."""
    check = (
        "import sys\n"
        "from autotune.execution._cluster import check_node_paths, connect\n"
        "ray = connect(sys.argv[1])\n"
        "check_node_paths(ray, (sys.argv[2], sys.argv[3]), sys.argv[1])\n"
    )
    absent = str(tmp_path / "elsewhere" / "train.py")
    done = subprocess.run(
        [sys.executable, "-c", check, cluster.address, str(SCRIPT), absent],
        env={**os.environ, **cluster.client_env(), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    host = cluster.address.rsplit(":", 1)[0]
    assert f"{absent} is not on {host} (node " in last, done.stderr[-2000:]
    assert "a shared filesystem, or copies at the same paths" in last
