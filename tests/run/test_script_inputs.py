"""Planning a script study: the global batch a flag gives always wins over the script's
config, with a note; ``--global-batch auto`` searches it as for a built-in workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.scripted import example_script_run

SPACE = "precision: [fp32]\nzero_stage: [0]\nmicro_batch_size: [2, 4, 8, 16]\n"


def _resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **flags: object):
    (tmp_path / "space.yaml").write_text(SPACE)
    return example_script_run(tmp_path, monkeypatch, space=str(tmp_path / "space.yaml"), **flags)


def test_global_batch_auto_searches_the_batch_of_a_script(tmp_path, monkeypatch) -> None:
    resolved = _resolved(tmp_path, monkeypatch, global_batch="auto", max_global_batch=32)
    batches = {c.train_batch_size for c in resolved.space.candidates()}
    assert len(batches) > 1 and max(batches) <= 32  # searched, not the config's 32 alone
    assert {c.micro_batch_size for c in resolved.space.candidates()} == {2, 4, 8, 16}
    assert any("--global-batch auto replaces the train_batch_size 32" in n for n in resolved.notes)
    assert resolved.config.global_batch is None


def test_a_global_batch_given_replaces_the_configs_with_a_note(tmp_path, monkeypatch) -> None:
    resolved = _resolved(tmp_path, monkeypatch, global_batch=16)
    assert {c.train_batch_size for c in resolved.space.candidates()} == {16}
    assert (
        "--global-batch 16 replaces the train_batch_size 32 of train.py's config" in resolved.notes
    )
    unchanged = _resolved(tmp_path, monkeypatch)
    assert {c.train_batch_size for c in unchanged.space.candidates()} == {32}
    assert not any("replaces the train_batch_size" in n for n in unchanged.notes)
