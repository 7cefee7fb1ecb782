"""A run's storage is checked before anything is written: it opens, or one line says why,
and the check itself creates nothing."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.errors import StorageError
from autotune.study import check_reachable


def test_a_new_sqlite_file_in_a_writable_folder_passes_and_is_not_created(tmp_path: Path):
    check_reachable(f"sqlite:///{tmp_path}/new/folder/autotune.db")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_study_database_opens_read_only(tmp_path: Path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path}/a.db"
    optuna.create_study(study_name="s", storage=url)
    before = (tmp_path / "a.db").stat().st_mtime_ns
    check_reachable(url)
    monkeypatch.chdir(tmp_path)
    check_reachable("sqlite:///a.db")  # relative to the working folder, as a user types it
    assert (tmp_path / "a.db").stat().st_mtime_ns == before


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("not_a_db.db", "cannot open the SQLite file"),
        ("/proc/autotune-nowhere/a.db", "cannot open the SQLite file /proc/autotune-nowhere"),
        ("postgresql+psycopg2://u:secret@127.0.0.1:9/db", "u:***@127.0.0.1:9/db: cannot open"),
        ("notaurl", "--storage notaurl: cannot open"),
    ],
)
def test_what_cannot_open_is_one_storage_error(tmp_path: Path, name: str, words: str) -> None:
    (tmp_path / "not_a_db.db").write_text("plain text, not SQLite")
    url = name if "://" in name or name == "notaurl" else f"sqlite:///{name}"
    if name == "not_a_db.db":
        url = f"sqlite:///{tmp_path}/{name}"
    with pytest.raises(StorageError) as error:
        check_reachable(url)
    assert words in str(error.value) and "secret" not in str(error.value)
