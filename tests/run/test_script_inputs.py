"""Planning a script study: the global batch a flag gives always wins over the script's
config, with a note; ``--global-batch auto`` searches it as for a built-in workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.paths import ROOT

EXAMPLE = ROOT / "examples" / "vision_deepspeed"
SPACE = "precision: [fp32]\nzero_stage: [0]\nmicro_batch_size: [2, 4, 8, 16]\n"


def _resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **flags: object):
    from autotune.run._resolved_run import resolve_run
    from autotune.script_config import parse_script
    from autotune.settings import RunSettings

    monkeypatch.chdir(EXAMPLE)
    (tmp_path / "space.yaml").write_text(SPACE)
    script = parse_script(
        "train.py", ["--deepspeed", "--deepspeed_config", "ds_config.json"], [], cwd=EXAMPLE
    )
    settings = RunSettings.build(
        workload=f"script:{script.path}",
        script=script,
        world_sizes=(2,),
        space=str(tmp_path / "space.yaml"),
        trials_dir=tmp_path / "trials",
        **flags,
    )
    return resolve_run(settings)


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
