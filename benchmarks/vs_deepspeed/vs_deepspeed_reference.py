"""What a pick of the DeepSpeed comparison is scored against: the reference set.

DeepSpeed's grid (``benchmarks/spaces/ds_comparable.yaml``: bf16, ZeRO 0-3 x micro-batch, no
offload, no checkpointing, no FSDP2) is all the comparison measured at first, so a pick of
autotune's full space scored by the grid's best is scored against DeepSpeed's space only.
With a reference table (``benchmarks/search_efficiency/data/table_<name>.json``: every
candidate of a space measured, ``search_efficiency.py dump``), the set also holds the
table's K fastest configs and the round winners: each autotune study's export and the config
its confirmation round ranked first (its highest estimate, which the simpler or the steadier
may have beaten). All of them are re-measured in the same interleaved rounds as the grid and
the picks (``vs_deepspeed_autotuner.harness``), and a pick's score is its median over the
best median of the set.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autotune.candidate import Candidate
from benchmarks.search_efficiency.search_efficiency_table import relative

GRID = "DeepSpeed's grid"


def key(candidate: dict[str, Any]) -> str:
    return Candidate.model_validate(candidate).key


def table_top(path: Path, top: int, workload: str, ranks: int, global_batch: int) -> list[dict]:
    """The ``top`` fastest configs the table at ``path`` measured ``ok``; the table must be
    of the comparison's workload (``workload``: its reference, as ``WORKLOADS`` maps it),
    ranks and global batch."""
    table = json.loads(path.read_text())
    wanted = {"workload": relative(workload), "ranks": ranks, "global_batch": global_batch}
    for field, value in wanted.items():
        if table.get(field) != value:
            raise SystemExit(
                f"--reference-table {path}: its {field} is {table.get(field)!r}, the "
                f"comparison's is {value!r}; pass a table of the same workload, ranks and "
                "global batch (benchmarks/search_efficiency/data/table_*.json)"
            )
    rows = [row for row in table["rows"] if row["status"] == "ok" and row["samples_per_s"] > 0]
    rows.sort(key=lambda row: row["samples_per_s"], reverse=True)
    return [row["candidate"] for row in rows[:top]]


def round_winners(runs: list[dict[str, Any]]) -> list[dict]:
    """Each autotune study's export and the config its round ranked first, where recorded
    (``vs_deepspeed_tuners.autotune_pick``; runs written before that record the export
    alone)."""
    found: list[dict] = []
    for run in runs:
        if run["tuner"] == "deepspeed":
            continue
        found.append(run["candidate"])
        if run.get("round_first"):
            found.append(run["round_first"])
    return found


def reference(
    path: Path, top: int, runs: list[dict[str, Any]], workload: str, ranks: int, batch: int
) -> dict[str, Any]:
    """The reference set beyond the grid, as the comparison's JSON keeps it."""
    from_table = table_top(path, top, workload, ranks, batch)
    winners = round_winners(runs)
    unique = {key(c): c for c in from_table + winners}
    name = path.stem.removeprefix("table_")
    return {
        "name": f"{GRID} + table {name} top {top} + round winners",
        "table": path.name,  # its file name: the JSON holds no path
        "top": top,
        "table_top": [Candidate.model_validate(c).label for c in from_table],
        "round_winners": [Candidate.model_validate(c).label for c in winners],
        "candidates": list(unique.values()),
    }


def reference_keys(data: dict[str, Any]) -> set[str]:
    """The keys of every config of the reference set: the grid and, where the run has one,
    the reference beyond it."""
    extra = data.get("reference", {}).get("candidates", [])
    return {key(c) for c in data["grid"] + extra}


def score(data: dict[str, Any]) -> dict[str, Any]:
    """The best of the reference set by the harness's medians, and each run's pick as a
    fraction of it."""
    measured = data["harness"]
    best_key = max(reference_keys(data) & set(measured), key=lambda k: measured[k]["median"])
    best = measured[best_key]["median"]
    return {
        "reference_set": data.get("reference", {}).get("name", GRID),
        "best": measured[best_key]["label"],
        "best_samples_per_s": best,
        "of_best": [measured[key(run["candidate"])]["median"] / best for run in data["runs"]],
    }
