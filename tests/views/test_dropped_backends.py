"""A backend the study's space lists but the study could not train with is said, with its
reason, where people look: ``autotune status`` and ``status --json``, summary.md,
report.html and the dashboard's study note."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.space import DroppedBackend
from autotune.study import dropped_backends, store_dropped_backends
from tests.views.synthetic import NAME

REASON = "a --script study probes the DeepSpeed engine its script builds"
LINE = f"backend fsdp2 dropped: {REASON}"


def test_every_view_says_which_backend_was_dropped_and_why(
    synthetic: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autotune.cli._app import main
    from autotune.export._exporter import export
    from autotune.views import write_report
    from autotune.views._dashboard import study_note
    from autotune.views._report_data import collect

    study = optuna.load_study(study_name=NAME, storage=synthetic)
    assert dropped_backends(study) == []  # nothing stored: nothing said
    before = Path(export(study, tmp_path / "before").summary).read_text()
    assert "dropped" not in before
    store_dropped_backends(study, [DroppedBackend(backend="fsdp2", reason=REASON)])

    assert main(["status", "--storage", synthetic, "--study", NAME]) == 0
    assert LINE in " ".join(capsys.readouterr().out.split())  # the table may wrap it
    assert main(["status", "--storage", synthetic, "--study", NAME, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["dropped_backends"] == [{"backend": "fsdp2", "reason": REASON}]
    summary = Path(export(study, tmp_path / "out").summary).read_text()
    search = summary.split("## Search", 1)[1].split("## ", 1)[0]
    assert f"- The space's {LINE}." in search
    page = write_report(study, tmp_path / "report.html").read_text()
    assert f"<li>{LINE}</li>" in page
    assert f"- {LINE}" in study_note(collect(study), None)
