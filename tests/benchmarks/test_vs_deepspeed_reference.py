"""The DeepSpeed comparison's reference set (benchmarks/vs_deepspeed/vs_deepspeed_reference.py,
benchmarks/vs_deepspeed/vs_deepspeed_autotuner.py): with ``--reference-table``, the table's fastest
configs and the round winners are measured in the same interleaved rounds as DeepSpeed's
grid and the picks, each pick is scored against the best of all of them, and the printed
tables and the JSON name the set. The harness is scripted (fixed samples/s per config):
what is checked is which configs are measured together and what a pick is scored against,
not a timing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.candidate import Candidate, FsdpKnobs
from autotune.study.confirmation import Confirmation, Contender
from benchmarks.vs_deepspeed import vs_deepspeed_autotuner as comparison
from benchmarks.vs_deepspeed import vs_deepspeed_reference as reference
from benchmarks.vs_deepspeed.vs_deepspeed_tuners import round_first

ROOT = Path(__file__).resolve().parents[2]
TABLES = ROOT / "benchmarks" / "search_efficiency" / "data"
AMX_TABLE = TABLES / "table_gpt-tiny-amx.json"  # gpt-tiny, 2 ranks, global batch 16
DIT_TABLE = TABLES / "table_dit-cpu.json"
RUNS = ROOT / "benchmarks" / "vs_deepspeed" / "data"
EARLIER_RUN = RUNS / "vs_deepspeed_autotuner_amx_lower_5repeats.json"


def candidate(label: str) -> dict[str, Any]:
    """A bf16 candidate of 2 ranks at global batch 16 from its short label."""
    stage, mb, *offload = label.split()
    micro, accumulation = (int(x) for x in mb.removeprefix("mb").split("x"))
    return Candidate(
        precision="bf16",
        zero_stage=int(stage.removeprefix("z")),
        offload_optimizer="cpu" if offload else "none",
        micro_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        data_parallel_size=2,
    ).model_dump(mode="json")


FSDP2 = Candidate(
    backend="fsdp2",
    precision="bf16",
    zero_stage=3,
    micro_batch_size=8,
    gradient_accumulation_steps=1,
    data_parallel_size=2,
    fsdp=FsdpKnobs(reshard_after_forward=False),
).model_dump(mode="json")


class ScriptedHarness:
    """Stands in for the harness's real probes: each config measures its scripted
    samples/s (100 where none is scripted) in every round; every call is kept."""

    def __init__(self, rates: dict[str, float]) -> None:
        self.rates = rates  # by candidate key
        self.calls: list[set[str]] = []

    def __call__(
        self, candidates: list[dict[str, Any]], rounds: int, workload: str
    ) -> dict[str, dict[str, Any]]:
        assert workload == "gpt-tiny"
        parsed = {reference.key(c): Candidate.model_validate(c) for c in candidates}
        self.calls.append(set(parsed))
        return {
            key: {
                "label": c.label,
                "candidate": c.model_dump(mode="json"),
                "samples_per_s": [self.rates.get(key, 100.0)] * rounds,
                "median": self.rates.get(key, 100.0),
            }
            for key, c in parsed.items()
        }


def run(tuner: str, pick: dict, first: dict | None = None) -> dict[str, Any]:
    return {
        "repeat": 1,
        "tuner": tuner,
        "wall_s": 60.0,
        "probes": 10,
        "candidate": pick,
        "round_first": first,
    }


# the grid's best is z0 mb8x1 (200); the table's best, z1 mb8x1 opt:cpu, is outside the
# grid (250); the full-space study's round ranked an FSDP2 config first (230)
RATES = {
    reference.key(candidate("z0 mb8x1")): 200.0,
    reference.key(candidate("z1 mb8x1 opt")): 250.0,
    reference.key(FSDP2): 230.0,
}
RUNS = [
    run("deepspeed", candidate("z1 mb8x1")),
    run("autotune workload (ds_comparable)", candidate("z0 mb8x1"), candidate("z0 mb8x1")),
    run("autotune workload (default)", candidate("z0 mb8x1"), FSDP2),
]
del RUNS[0]["round_first"]  # DeepSpeed's autotuner has no round


def arguments(*extra: str):
    return comparison.arguments().parse_args(["--rounds", "3", *extra])


def test_the_reference_set_is_measured_with_the_grid_and_scores_every_pick(
    capsys: pytest.CaptureFixture[str],
) -> None:
    harness = ScriptedHarness(RATES)
    args = arguments("--reference-table", str(AMX_TABLE), "--reference-top", "3")
    data = comparison.measure_runs(args, RUNS, measure=harness)

    [measured_together] = harness.calls  # one harness: the same interleaved rounds
    grid = {reference.key(c) for c in data["grid"]}
    table_top = {
        reference.key(candidate(x)) for x in ("z1 mb8x1 opt", "z1 mb4x2 opt", "z2 mb8x1 opt")
    }
    assert len(grid) == 16
    assert grid | table_top | {reference.key(FSDP2)} <= measured_together
    assert {reference.key(r["candidate"]) for r in RUNS} <= measured_together

    name = "DeepSpeed's grid + table gpt-tiny-amx top 3 + round winners"
    assert data["score"]["reference_set"] == name
    assert data["score"]["best"] == "z1 bf16 mb8x1 opt:cpu"
    # every pick against the table's best (250), not the grid's (200)
    assert data["score"]["of_best"] == [100 / 250, 200 / 250, 200 / 250]
    assert data["reference"]["table"] == "table_gpt-tiny-amx.json"  # its name, no path
    fsdp2 = Candidate.model_validate(FSDP2).label
    assert data["reference"]["round_winners"] == ["z0 bf16 mb8x1"] * 3 + [fsdp2]
    json.dumps(data)  # what the run writes

    comparison.report(data)
    printed = capsys.readouterr().out
    assert f"scored against the best of {name}: z1 bf16 mb8x1 opt:cpu at 250.00" in printed
    assert "| 0.800 |" in printed and "| 0.400 |" in printed
    assert f"the reference beyond the grid ({name})" in printed


def test_without_a_reference_table_the_grid_alone_is_the_reference(
    capsys: pytest.CaptureFixture[str],
) -> None:
    harness = ScriptedHarness(RATES)
    data = comparison.measure_runs(arguments(), RUNS, measure=harness)

    [measured_together] = harness.calls
    assert reference.key(FSDP2) not in measured_together
    assert data["score"]["reference_set"] == "DeepSpeed's grid"
    assert data["score"]["of_best"] == [100 / 200, 1.0, 1.0]
    comparison.report(data)
    assert "scored against the best of DeepSpeed's grid: z0 bf16 mb8x1 at 200.00" in (
        capsys.readouterr().out
    )


def test_a_recheck_measures_an_earlier_runs_reference_in_the_same_rounds() -> None:
    data = json.loads(EARLIER_RUN.read_text())
    grid_best = max(
        (data["harness"][reference.key(c)] for c in data["grid"]), key=lambda r: r["median"]
    )
    faster = grid_best["median"] * 1.1
    harness = ScriptedHarness({reference.key(candidate("z1 mb8x1 opt")): faster})
    widen = reference.reference(AMX_TABLE, 5, data["runs"], "gpt-tiny", 2, 16)
    comparison.recheck(data, top=2, rounds=9, widen=widen, measure=harness)

    [measured_together] = harness.calls
    table_top = {reference.key(c) for c in widen["candidates"]}
    picks = {reference.key(r["candidate"]) for r in data["runs"]}
    assert table_top | picks <= measured_together
    assert reference.key(grid_best["candidate"]) in measured_together  # the grid's fastest
    # a config the run had not measured joins its harness with the recheck's samples alone
    joined = data["harness"][reference.key(candidate("z1 mb8x1 opt"))]
    assert joined["samples_per_s"] == [faster] * 9
    assert data["score"]["best"] == "z1 bf16 mb8x1 opt:cpu"
    assert data["score"]["reference_set"] == (
        "DeepSpeed's grid + table gpt-tiny-amx top 5 + round winners"
    )
    for run, of_best in zip(data["runs"], data["score"]["of_best"], strict=True):
        median = data["harness"][reference.key(run["candidate"])]["median"]
        assert of_best == pytest.approx(median / faster)
        assert of_best < 1.0


def test_a_table_of_another_workload_is_refused() -> None:
    with pytest.raises(
        SystemExit, match=re.escape("its workload is 'benchmarks/workloads.py:dit_cpu'")
    ):
        reference.reference(DIT_TABLE, 5, RUNS, "gpt-tiny", 2, 16)


def test_a_reference_table_without_measurements_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "vs_deepspeed" / "vs_deepspeed_autotuner.py"),
            "--report",
            str(EARLIER_RUN),
            "--reference-table",
            str(AMX_TABLE),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--reference-table needs measurements" in done.stderr.splitlines()[-1]


def test_the_round_winner_recorded_is_the_highest_estimate_not_the_simpler_pick() -> None:
    offload, plain = candidate("z1 mb8x1 opt"), candidate("z1 mb8x1")
    verdict = Confirmation(
        contenders=[
            Contender(trial=0, label="offload", samples_per_s=[250, 251, 249], moving_parts=[1]),
            Contender(trial=1, label="plain", samples_per_s=[247, 246, 248], moving_parts=[0]),
        ]
    )
    verdict.decide()
    assert verdict.winner == 1 and verdict.simpler_over == 0  # the simpler won the round

    class Trial:  # a stored trial as autotune_pick reads it: its candidate
        def __init__(self, c: dict[str, Any]) -> None:
            self.candidate = Candidate.model_validate(c)

    assert round_first(verdict, [Trial(offload), Trial(plain)]) == offload
    assert round_first(None, []) is None
