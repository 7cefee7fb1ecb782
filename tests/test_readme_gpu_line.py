"""README says in one line what has run on a GPU: nothing, until a GPU check's report (not a
CPU dry run) is committed under benchmarks/gpu_check/data/; then the line must change."""

from __future__ import annotations

import json

from tests.support.paths import ROOT

NOTHING_YET = "**Run on a GPU so far: nothing.**"
REPORTS = ROOT / "benchmarks" / "gpu_check" / "data"


def _gpu_reports() -> list[str]:
    """The committed GPU check reports that ran on a GPU (dry runs left out)."""
    found = []
    for path in sorted(REPORTS.glob("**/gpu_check.json")) if REPORTS.is_dir() else []:
        if not json.loads(path.read_text(encoding="utf-8")).get("dry_run", True):
            found.append(str(path.relative_to(ROOT)))
    return found


def test_readme_says_what_has_run_on_a_gpu_and_how_to_change_it() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    reports = _gpu_reports()
    if reports:
        assert NOTHING_YET not in readme, f"README says nothing ran on a GPU, but {reports} did"
        assert all(report in readme for report in reports), "README names no GPU report"
    else:
        assert NOTHING_YET in readme, "README must say that nothing has run on a GPU yet"
    assert "benchmarks/gpu_check/gpu_check.sh" in readme.split("## The two commands")[0]
