"""benchmarks/collectives/gloo_collectives.py on two real gloo ranks: each size's all-reduce
and all-gather timed, the rates in the cost model's units, the machine recorded."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_each_size_gets_both_collectives_timed_and_its_rates(tmp_path) -> None:
    out = tmp_path / "gloo.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/collectives/gloo_collectives.py"),
            *("--rounds", "2", "--sizes", "1000", "200000"),
            *("--port", str(_free_port()), "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(out.read_text())
    assert [row["psi"] for row in report["rows"]] == [1000, 200000]
    for row in report["rows"]:
        psi = row["psi"]
        assert len(row["all_reduce_s"]) == len(row["all_gather_s"]) == 2
        # the formulas' elements over the median: 2 (d-1)/d Psi and (d-1)/d Psi at d = 2,
        # fp32 (the stored seconds are rounded to the microsecond)
        reduce_s, gather_s = (statistics.median(row[k]) for k in ("all_reduce_s", "all_gather_s"))
        assert row["all_reduce_model_bytes_s"] == pytest.approx(psi * 4 / reduce_s, rel=0.05)
        assert row["all_gather_model_bytes_s"] == pytest.approx(psi / 2 * 4 / gather_s, rel=0.05)
    assert report["ranks"] == 2 and report["machine"]["cpu"]
    assert "| 200,000 |" in done.stdout
