"""Memory model against the peaks measured by an exhaustive search table (no new probes).

    python benchmarks/memory_accuracy/memory_vs_table.py \\
        benchmarks/search_efficiency/data/table_gpt2-seq32.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autotune.candidate import Candidate
from autotune.memory import MemoryModel
from autotune.workloads import get_workload


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "table",
        type=Path,
        nargs="?",
        default=Path("benchmarks/search_efficiency/data/table_gpt2-seq32.json"),
        help="a table written by search_efficiency.py dump",
    )
    table = json.loads(parser.parse_args().table.read_text())
    model = MemoryModel(get_workload(table["workload"]))
    errors = []
    print("| candidate | phase | predicted MiB | measured MiB | error |")
    print("|---|---|---|---|---|")
    for row in table["rows"]:
        if row["status"] != "ok":
            continue
        candidate = Candidate.model_validate(row["candidate"])
        estimate = model.predict(candidate)
        predicted, measured = estimate.tracked_bytes("cpu"), row["peak_bytes"]
        errors.append((predicted - measured) / measured)
        print(
            f"| {candidate.label} | {estimate.phase} | {predicted / 2**20:.1f} | "
            f"{measured / 2**20:.1f} | {100 * errors[-1]:+.1f}% |"
        )
    absolute = [abs(e) for e in errors]
    under = [-e for e in errors if e < 0]
    print(f"\ncandidates: {len(errors)}")
    print(f"median |error|: {100 * statistics.median(absolute):.2f}%")
    print(f"worst |error|: {100 * max(absolute):.2f}%")
    print(f"worst under-prediction: {100 * max(under, default=0):.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
