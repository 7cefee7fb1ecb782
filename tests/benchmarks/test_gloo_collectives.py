"""benchmarks/collectives/gloo_collectives.py on two real gloo ranks: each size's all-reduce
and all-gather timed, the rates in the cost model's units, the machine recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_each_size_gets_both_collectives_timed_and_its_rates(tmp_path) -> None:
    out = tmp_path / "gloo.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/collectives/gloo_collectives.py"),
            "--rounds",
            "2",
            "--sizes",
            "1000",
            "200000",
            "--port",
            "29637",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(out.read_text())
    assert [row["psi"] for row in report["rows"]] == [1000, 200000]
    for row in report["rows"]:
        assert len(row["all_reduce_s"]) == len(row["all_gather_s"]) == 2
        assert min(row["all_reduce_s"] + row["all_gather_s"]) > 0
        # the formula's elements over the median time: 2 (d-1)/d Psi and (d-1)/d Psi at d = 2
        reduce_s = sorted(row["all_reduce_s"])
        assert row["all_reduce_model_bytes_s"] > 0 and row["all_gather_model_bytes_s"] > 0
        assert row["all_reduce_model_bytes_s"] <= row["psi"] * 4 / min(reduce_s) * 1.01
    assert report["ranks"] == 2 and report["machine"]["cpu"]
    assert "| 200,000 |" in done.stdout
