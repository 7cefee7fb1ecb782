"""A folder is judged writable without leaving a file or folder behind."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from autotune.writable import check_folder_writable, why_not_writable


def test_a_folder_to_be_created_is_judged_by_its_nearest_existing_ancestor(tmp_path: Path):
    check_folder_writable(tmp_path / "a" / "b" / "c")
    check_folder_writable(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing created, nothing left


def test_a_file_in_the_way_or_an_unwritable_ancestor_is_an_error_naming_the_folder(
    tmp_path: Path,
) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError) as in_the_way:
        check_folder_writable(tmp_path / "file" / "sub")
    assert in_the_way.value.filename == str(tmp_path / "file")
    with pytest.raises(OSError) as procfs:  # /proc takes no files, even from root
        check_folder_writable(Path("/proc/autotune-nowhere/trials"))
    assert procfs.value.filename == "/proc"
    assert why_not_writable(procfs.value).endswith(": /proc")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_a_full_disk_says_so() -> None:
    assert why_not_writable(OSError(errno.ENOSPC, "No space left on device")) == (
        "the disk is full"
    )
