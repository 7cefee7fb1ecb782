"""The suite's ordering plugin (tests/support/unit_order.py) in a real pytest run on a tiny
test tree: a slow test waits for the newcomer's run to build DeepSpeed's ops only where
the newcomer's test is among the tests that will run, whatever removed it (``-k``,
``--deselect``, a folder)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

INI = """\
[pytest]
markers =
    slow: slow
    nvme_op: loads the async I/O op
"""
CONFTEST = """\
from tests.support.unit_order import (
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_xdist_make_scheduler,
)
"""
NEWCOMER = """\
import pytest

@pytest.mark.slow
def test_newcomer():
    pass
"""
CLUSTER = """\
import pytest
from tests.support.unit_order import waits_for_newcomer

@pytest.mark.slow
def test_cluster(request):
    print("waits for the newcomer:", waits_for_newcomer(request.node))
"""


def _tree(root: Path) -> Path:
    files = {
        "pytest.ini": INI,
        "conftest.py": CONFTEST,
        "e2e/test_newcomer.py": NEWCOMER,
        "integration/test_cluster.py": CLUSTER,
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    ("selection", "waits"),
    [
        ([], True),
        (["-k", "cluster"], False),
        (["--deselect", "e2e/test_newcomer.py::test_newcomer"], False),
        (["integration"], False),
    ],
    ids=["everything", "-k", "--deselect", "a folder"],
)
def test_a_slow_test_waits_only_for_a_newcomer_run_that_will_run(
    tmp_path: Path, selection: list[str], waits: bool
) -> None:
    tree = _tree(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *selection],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"waits for the newcomer: {waits}" in run.stdout, run.stdout
