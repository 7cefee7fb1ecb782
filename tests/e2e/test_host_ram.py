"""--host-ram judged on what the probe measured, as a user runs it: real DeepSpeed on 2 CPU
ranks with the optimizer offloaded to the host, under a --host-ram smaller than what the
ranks' processes hold. The memory model does not predict host memory on CPU ranks, so the
candidate is probed, and its measurement rules it out."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.study import records
from tests.support.cli import run_cli
from tests.support.cli_study import FAST

pytestmark = pytest.mark.slow

OFFLOAD_SPACE = """\
precision: [fp32]
zero_stage: [2]
offload_optimizer: [cpu]
offload_param: [none]
micro_batch_size: [2]
gradient_accumulation_steps: [2]
activation_checkpointing: [false]
"""
HOST_RAM_BYTES = 256 * 2**20  # a forked CPU rank's process alone holds more


def test_a_probe_whose_ranks_hold_more_than_host_ram_is_infeasible(tmp_path: Path) -> None:
    (tmp_path / "offload.yaml").write_text(OFFLOAD_SPACE)
    run = run_cli(
        *["run", "--workload", "gpt-tiny", "--gpus", "2", "--space", "offload.yaml"],
        *["--global-batch", "8", *FAST, "--host-ram", "256MiB", "--max-trials", "1"],
        *["--budget", "4m", "--executor", "local"],
        cwd=tmp_path,
    )
    assert run.returncode == 3, run.stdout + run.stderr  # nothing to export
    assert "limit per rank and --host-ram per node" in run.stderr
    study = optuna.load_study(
        study_name="gpt-tiny", storage=f"sqlite:///{tmp_path}/trials/autotune.db"
    )
    (view,) = records.views(study)
    record = view.record
    # a real measurement (COMPLETE, its samples/s), infeasible from its host memory alone
    assert view.status == "ok" and view.state == "COMPLETE" and record.samples_per_s > 0
    assert not view.feasible and not record.feasible
    assert record.host_ram_bytes == HOST_RAM_BYTES and record.host_peak_method == "kernel_hwm"
    peaks, nodes = record.host_peak_bytes_per_rank, record.node_per_rank
    assert len(peaks) == 2 and min(peaks) > 0 and len(set(nodes)) == 1
    over_bytes = sum(peaks) - HOST_RAM_BYTES
    assert over_bytes > 0 and view.frozen.constraints[records.CONSTRAINT] == over_bytes
    assert record.peak_bytes < record.vram_limit_bytes  # the device's limit is met
    why = record.error
    assert why.startswith("measured host memory ") and f"on node {nodes[0]} (2 rank(s))" in why
    assert "is over --host-ram 256.00 MiB" in why and "kernel high-water mark" in why
    assert f"infeasible: {why}" in run.stdout  # the run's line for the probe

    status = run_cli("status", "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    (entry,) = document["trials"]
    assert entry["error"] == why and entry["feasible"] is False
    assert entry["host_peak_bytes_per_rank"] == peaks and entry["host_peak_method"] == "kernel_hwm"
    assert document["counts"]["outcomes"] == {
        "infeasible: measured host memory above --host-ram": 1
    }
