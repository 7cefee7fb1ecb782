"""``--json`` on status, plan, space and export: one JSON document on stdout, stable keys
(docs/json.md), the same best as every other output."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import optuna

from autotune.study import best
from autotune.views import loss_check_document
from tests.support.cli import run_cli
from tests.support.loss_checks import check
from tests.views.synthetic import NAME

SPACE = """\
precision: [fp32]
zero_stage: [0, 1]
micro_batch_size: [1, 2, 4]
activation_checkpointing: [false, true]
"""


def _json(*args: str, cwd: Path) -> dict[str, Any]:
    result = run_cli(*args, "--json", cwd=cwd, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)  # the whole of stdout is the document


def test_status_json(synthetic: str, tmp_path: Path) -> None:
    document = _json("status", "--storage", synthetic, cwd=tmp_path)
    assert (document["kind"], document["version"]) == ("autotune.status", 2)
    assert set(document) == {
        "kind", "version", "study", "goal", "config", "dropped_backends", "budget", "best",
        "confirmation", "verification", "counts", "world_sizes", "trials",
    }  # fmt: skip
    assert document["dropped_backends"] == []  # a study stored before drops were kept
    assert document["goal"]["objective"] == "throughput"  # a study that never stored one
    assert document["trials"][0]["time_to_train_s"] is None  # no size given: no time
    assert document["verification"] == {}  # no trial of it was verified
    assert [entry["gpus"] for entry in document["world_sizes"]] == [2]  # one world size
    decided = best.of_study(optuna.load_study(study_name=NAME, storage=synthetic))
    assert decided is not None and document["best"] == decided.model_dump()
    assert document["counts"]["evaluated"] == 8 and document["counts"]["duplicates"] == 1
    starred = [t["number"] for t in document["trials"] if t["best"]]
    assert starred == [decided.trial]
    oom = document["trials"][4]
    assert oom["status"] == "oom" and oom["samples_per_s"] is None and not oom["feasible"]
    assert document["trials"][0]["candidate"]["micro_batch_size"] == 4
    assert document["config"]["vram_limit_bytes"] == 64 * 2**20


def test_export_json(synthetic: str, tmp_path: Path) -> None:
    out = tmp_path / "prod"
    document = _json("export", "--storage", synthetic, "-o", str(out), cwd=tmp_path)
    assert document["kind"] == "autotune.export" and document["trial"] == 0
    assert Path(document["files"]["ds_config"]).exists()
    assert document["ds_config"] == json.loads((out / "ds_config.json").read_text())
    assert document["best"]["confirmed"] is True
    # the neutral keys (version 2) name the same file for DeepSpeed
    assert document["backend"] == "deepspeed"
    assert document["files"]["backend_config"] == document["files"]["ds_config"]
    assert document["backend_config"] == document["ds_config"]


def test_an_fsdp2_export_is_named_by_the_neutral_keys_alone(tmp_path: Path) -> None:
    from autotune.export import Exported
    from autotune.views import export_document

    (tmp_path / "fsdp2_config.json").write_text('{"reshard_after_forward": true}')
    exported = Exported(
        trial=3,
        label="fsdp2 fp32 mb8x1 reshard:yes",
        folder=str(tmp_path),
        backend="fsdp2",
        config_file=str(tmp_path / "fsdp2_config.json"),
        launch=str(tmp_path / "launch.sh"),
        summary=str(tmp_path / "summary.md"),
    )
    document = export_document("s", exported, None)
    assert document["backend"] == "fsdp2" and document["version"] == 2
    assert document["backend_config"] == {"reshard_after_forward": True}
    assert document["files"]["backend_config"] == str(tmp_path / "fsdp2_config.json")
    assert "ds_config" not in document and "ds_config" not in document["files"]


def test_space_and_plan_json(tmp_path: Path) -> None:
    (tmp_path / "small.yaml").write_text(SPACE)
    space = _json("space", "--space", "small.yaml", "--gpus", "2", cwd=tmp_path)
    assert space["kind"] == "autotune.space" and space["candidates"] == 12
    assert space["dimensions"]["zero_stage"] == {"0": 6, "1": 6}
    assert len(space["examples"]) == 5 and "label" in space["examples"][0]
    assert space["dropped_backends"] == []  # this torch trains with every backend
    plan = _json(
        "plan", "--workload", "gpt-tiny", "--gpus", "2", "--vram", "1GiB", "--space", "small.yaml",
        cwd=tmp_path,
    )  # fmt: skip
    assert plan["kind"] == "autotune.plan" and len(plan["candidates"]) == 12
    assert plan["fitting"] == sum(c["fits"] for c in plan["candidates"])
    first = plan["candidates"][0]
    assert set(first) == {
        "label", "candidate", "fits", "why_not", "device_bytes", "host_bytes", "peak_at",
    }  # fmt: skip
    assert first["fits"] and first["device_bytes"] < plan["limit_bytes"]


def test_status_table_stays_readable_in_80_columns(synthetic: str, tmp_path: Path) -> None:
    """A terminal of 80 columns: the long candidates and notes wrap, and every header and
    number is whole (rich otherwise cuts the narrowest columns to an ellipsis)."""
    result = run_cli("status", "--storage", synthetic, cwd=tmp_path, env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert lines and max(len(line) for line in lines) <= 80
    header = next(line for line in lines if "status" in line and "#" in line)
    for column in ("#", "status", "candidate", "samples/s", "tokens/s", "peak/rank", "note"):
        assert f" {column} " in header, header
    assert "…" not in result.stdout
    document = _json("status", "--storage", synthetic, cwd=tmp_path)
    for trial in document["trials"]:
        if trial["samples_per_s"]:
            assert f"{trial['samples_per_s']:.1f}" in result.stdout


def test_verify_json_writes_a_loss_that_is_not_finite_as_null() -> None:
    document = loss_check_document("s", check(3, [8.3, math.nan, math.nan]))
    text = json.dumps(document, allow_nan=False)  # strict JSON: NaN would raise
    parsed = json.loads(text)
    assert parsed["kind"] == "autotune.verify" and parsed["trial"] == 3
    assert parsed["runs"][2]["trace"]["losses"] == [8.3, None, None]
    assert parsed["verdict"]["max_relative_difference"] is None
    assert parsed["verdict"]["text"].startswith("differs: step 1, the loss is nan")
