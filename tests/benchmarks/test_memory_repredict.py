"""The memory model's re-predictions of measured peaks (``memory_accuracy.py --repredict ...
--out``): written as JSON with each file's workload's summary, and the committed file
(benchmarks/memory_accuracy/data/memory_accuracy_repredicted.json, which docs/search.md and
RESULTS.md quote) is what the current model predicts."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from benchmarks.memory_accuracy import memory_accuracy

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "memory_accuracy" / "data"


def test_repredictions_are_written_with_each_workloads_summary(tmp_path: Path) -> None:
    out = tmp_path / "repredicted.json"
    assert memory_accuracy.repredict([DATA / "memory_accuracy.json"], out) == 0
    document = json.loads(out.read_text())
    [summary] = document["summaries"]
    rows = document["rows"]
    assert summary["file"] == "memory_accuracy.json" and summary["workload"] == "gpt-tiny"
    assert summary["candidates"] == len(rows) == 32
    errors = [row["error"] for row in rows]
    assert summary["median_abs_error"] == statistics.median(abs(e) for e in errors)
    assert summary["worst_under_prediction"] == max(-e for e in errors if e < 0)
    for row in rows:
        assert row["error"] == pytest.approx(
            (row["predicted_bytes"] - row["measured_bytes"]) / row["measured_bytes"]
        )


def test_the_committed_repredictions_are_the_current_models(tmp_path: Path) -> None:
    out = tmp_path / "repredicted.json"
    memory_accuracy.repredict([DATA / "memory_accuracy.json"], out)
    fresh = json.loads(out.read_text())
    committed = json.loads((DATA / "memory_accuracy_repredicted.json").read_text())
    gpt_tiny = [row for row in committed["rows"] if row["workload"] == "gpt-tiny"]
    assert gpt_tiny == fresh["rows"], (
        "the memory model's predictions moved: regenerate the re-predictions (the command "
        "in benchmarks/memory_accuracy/memory_accuracy.py's docstring) and the numbers quoted "
        "from them"
    )
