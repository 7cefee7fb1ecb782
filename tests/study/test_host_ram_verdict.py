"""A probe's measured host memory against --host-ram: the ranks' peaks summed per node, a
node over the limit infeasible with the reason recorded, older records read as they were."""

from __future__ import annotations

import optuna
import pytest

from autotune.candidate import Candidate
from autotune.protocol import ProbeResult
from autotune.study import records
from autotune.study.records import TrialRecord

GIB = 2**30
CANDIDATE = Candidate(
    precision="bf16",
    zero_stage=2,
    micro_batch_size=2,
    gradient_accumulation_steps=2,
    data_parallel_size=2,
    offload_optimizer="cpu",
)


def _result(host_gib: list[float], nodes: list[str], peak_gib: float = 1.0) -> ProbeResult:
    return ProbeResult(
        status="ok",
        samples_per_s=10.0,
        samples_per_s_min=9.0,
        samples_per_s_max=11.0,
        step_time_s=0.8,
        step_times_s=[0.8, 0.8],
        peak_bytes_per_rank=[int(peak_gib * GIB)] * len(host_gib),
        host_peak_bytes_per_rank=[int(g * GIB) for g in host_gib],
        host_peak_method="kernel_hwm",
        node_per_rank=nodes,
        wall_s=5.0,
    )


def _recorded(result: ProbeResult, *, host_ram_gib: float) -> records.TrialView:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    record = TrialRecord(
        candidate=CANDIDATE,
        candidate_key=CANDIDATE.key,
        label=CANDIDATE.label,
        vram_limit_bytes=8 * GIB,
        host_ram_bytes=int(host_ram_gib * GIB),
    )
    records.record_probe(study, trial, record, result)
    return records.view_of(trial)


def test_ranks_of_one_node_over_host_ram_together_are_infeasible_and_say_why() -> None:
    view = _recorded(_result([3.0, 3.0], ["gpu-node-7", "gpu-node-7"]), host_ram_gib=4)
    # a true measurement of a configuration the node cannot hold: complete, never feasible
    assert view.state == "COMPLETE" and view.value == pytest.approx(10.0)
    assert view.status == "ok" and not view.feasible and not view.record.feasible
    assert view.frozen.constraints[records.CONSTRAINT] == pytest.approx(2 * GIB)
    error = view.record.error
    assert error.startswith("measured host memory 6.00 GiB on node gpu-node-7 (2 rank(s))")
    assert "over --host-ram 4.00 GiB by 2.00 GiB" in error
    assert "peak resident memory (kernel high-water mark)" in error
    assert view.record.over_host_ram
    assert view.record.host_peak_per_node() == {"gpu-node-7": 6 * GIB}
    assert records.ranked_feasible([view]) == []


def test_the_same_ranks_on_two_nodes_each_fit() -> None:
    view = _recorded(_result([3.0, 3.0], ["node-a", "node-b"]), host_ram_gib=4)
    assert view.feasible and view.record.error == "" and not view.record.over_host_ram
    # the tightest margin: 1 GiB of host RAM left on each node, 7 GiB of the device's
    assert view.frozen.constraints[records.CONSTRAINT] == pytest.approx(-1 * GIB)


def test_over_both_limits_says_both() -> None:
    view = _recorded(_result([3.0, 3.0], ["n", "n"], peak_gib=9.0), host_ram_gib=4)
    assert not view.feasible
    assert "measured peak 9.00 GiB per rank is over the limit 8.00 GiB" in view.record.error
    assert "on node n (2 rank(s)) is over --host-ram 4.00 GiB" in view.record.error


def test_a_record_from_before_host_memory_was_judged_reads_and_keeps_its_verdict() -> None:
    attrs = {  # user attrs of a schema-3 trial: no host_ram_bytes, method or nodes
        "candidate": CANDIDATE.model_dump(mode="json"),
        "status": "ok",
        "feasible": True,
        "host_peak_bytes_per_rank": [5 * GIB, 5 * GIB],
        "vram_limit_bytes": 8 * GIB,
        "autotune_schema": 3,
    }
    record = records.read(attrs)
    assert record.feasible and record.host_ram_bytes == 0
    assert record.host_peak_method == "at_end" and record.node_per_rank == []
    assert not record.over_host_ram  # never judged against a limit it did not have


def test_a_probe_not_judged_against_host_ram_is_judged_on_the_device_alone() -> None:
    view = _recorded(_result([300.0, 300.0], ["n", "n"]), host_ram_gib=0)
    assert view.feasible
    assert view.frozen.constraints[records.CONSTRAINT] == pytest.approx(-7 * GIB)
