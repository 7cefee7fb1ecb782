"""Every data file the published results name is committed and reads: README.md,
docs/*.md, benchmarks/README.md and benchmarks/RESULTS.md quote numbers from files in the
tools' data folders (``benchmarks/<tool>/data/``), named either by path
(``benchmarks/<tool>/data/x.json``, or ``<tool>/data/x.json`` from benchmarks/: it must be
in that folder) or bare (``x.json`` of one of the data files' families: it must be in one
of them); each named file must exist and parse. A name with a placeholder
(``table_NAME.json``) is a template and names no file; a glob
(``search_efficiency_dit-cpu_*.json``) must match at least one."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
DATA_FOLDERS = sorted(BENCHMARKS.glob("*/data"))
PUBLISHED = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    BENCHMARKS / "README.md",
    BENCHMARKS / "RESULTS.md",
]

# The families of the data folders' files: a bare name of one of them is a data file; other
# bare names (ds_config.json, exp.json) are files of a run, not data.
FAMILIES = (
    "activation_dial_",
    "backends_side_by_side",
    "gloo_collectives",
    "ideal_search_",
    "memory_accuracy",
    "op_build_cost",
    "plan_tables",
    "script_memory_accuracy",
    "search_efficiency_",
    "short_study_live_",
    "table_",
    "vs_deepspeed_autotuner",
)
# a file name, with the folder it is written under where one is (any folder but a tool's
# data folder names something else: /tmp/x.json, trials/<study>/best/ds_config.json)
NAME = re.compile(r"(?P<folder>[\w./<>-]*/)?(?P<name>[\w.+*<>-]+\.(?:json|csv))\b")
DATA_FOLDER = re.compile(r"(benchmarks/)?\w+/data/")


def named_data_files(text: str) -> set[str]:
    """The data files ``text`` names: by path from the repository root where it gives a
    tool's data folder, else by file name (globs kept as written)."""
    found = set()
    # a name broken over a line inside a code span (`benchmarks/x/data/\ny.json`) is one name
    text = re.sub(r"/\n\s*", "/", text)
    for match in NAME.finditer(text):
        folder, name = match.group("folder"), match.group("name")
        if folder is not None and DATA_FOLDER.fullmatch(folder):
            name = "benchmarks/" * (not folder.startswith("benchmarks/")) + folder + name
        elif folder not in (None, "data/") or not name.startswith(FAMILIES):
            continue
        if is_template(name):
            continue
        found.add(name)
    return found


def is_template(name: str) -> bool:
    """A name with a placeholder (``NAME``, ``LIMIT``, ``<name>``) stands for many files."""
    if "<" in name:
        return True
    parts = re.split(r"[_.\-+/]", name.rsplit(".", 1)[0])
    return any(part.isupper() and part.isalpha() for part in parts)


def files_named(name: str) -> list[Path]:
    """The committed files ``name`` names: in its folder, or (bare) in any data folder."""
    folders = [ROOT / name.rsplit("/", 1)[0]] if "/" in name else DATA_FOLDERS
    bare = name.rsplit("/", 1)[-1]
    return sorted(p for folder in folders for p in folder.glob(bare) if p.is_file())


def problems(names: set[str]) -> list[str]:
    """What is wrong with each named file: missing, or not parsable."""
    found = []
    for name in sorted(names):
        paths = files_named(name)
        if not paths:
            found.append(f"{name}: no such file in a data folder")
            continue
        for path in paths:
            try:
                if path.suffix == ".csv":
                    rows = list(csv.reader(path.read_text().splitlines()))
                    assert len(rows) > 1, "no rows"
                else:
                    json.loads(path.read_text())
            except (ValueError, AssertionError) as error:
                found.append(f"{path.name}: does not parse ({error})")
    return found


@pytest.mark.parametrize("doc", PUBLISHED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_data_file_a_published_page_names_is_committed_and_parses(doc: Path) -> None:
    names = named_data_files(doc.read_text())
    assert problems(names) == []


def test_the_pages_name_the_data_behind_their_numbers() -> None:
    names = set().union(*(named_data_files(p.read_text()) for p in PUBLISHED))
    bare = {name.rsplit("/", 1)[-1] for name in names}
    # the headline's families, each named somewhere
    for family in (
        "vs_deepspeed_autotuner",
        "search_efficiency_",
        "ideal_search_",
        "memory_accuracy",
        "table_",
    ):
        assert any(n.startswith(family) for n in bare), family
    assert len(bare) > 40


def test_every_data_file_is_in_its_tools_folder() -> None:
    """Only the tools' data folders hold data (no benchmarks/data/), each file of a family
    in one folder."""
    assert not (BENCHMARKS / "data").exists()
    for folder in DATA_FOLDERS:
        for path in folder.iterdir():
            assert path.name.startswith(FAMILIES) or path.is_dir(), path


def test_a_missing_or_broken_file_is_reported(tmp_path: Path) -> None:
    text = (
        "see `benchmarks/vs_deepspeed/data/vs_deepspeed_autotuner_nowhere.json`, "
        "`memory_accuracy/data/vs_deepspeed_autotuner.json` (not its folder), "
        "search_efficiency_nowhere_*.json and table_gpt-tiny.json; not /tmp/x.json, "
        "ds_config.json or table_NAME.json"
    )
    names = named_data_files(text)
    assert names == {
        "benchmarks/vs_deepspeed/data/vs_deepspeed_autotuner_nowhere.json",
        "benchmarks/memory_accuracy/data/vs_deepspeed_autotuner.json",
        "search_efficiency_nowhere_*.json",
        "table_gpt-tiny.json",
    }
    assert problems(names) == [
        "benchmarks/memory_accuracy/data/vs_deepspeed_autotuner.json: no such file in a data "
        "folder",
        "benchmarks/vs_deepspeed/data/vs_deepspeed_autotuner_nowhere.json: no such file in a "
        "data folder",
        "search_efficiency_nowhere_*.json: no such file in a data folder",
    ]
    assert named_data_files("`benchmarks/memory_accuracy/data/\n   memory_accuracy_dit.json`") == {
        "benchmarks/memory_accuracy/data/memory_accuracy_dit.json"
    }
