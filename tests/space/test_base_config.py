"""--base-config: loading, and refusing what contradicts the search before any probe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.backends import get_backend
from autotune.errors import SettingsError
from autotune.space import load_space, parse_space
from autotune.space._base_config import (
    base_global_batch,
    check_conflicts,
    find_auto_values,
    load_base_config,
)
from tests.support.hardware import CPU

DEEPSPEED = get_backend("deepspeed")

PRODUCTION = {
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95]}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
    "gradient_clipping": 1.0,
    "steps_per_print": 50,
}


def bound(text: str = "", batch: int = 16):
    spec = parse_space(text) if text else load_space("default")
    return spec.bind(CPU, data_parallel_size=2, global_batch=batch)


def test_load_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"optimizer": {"type": "Adam",}}')
    with pytest.raises(SettingsError, match=r"bad.json: not valid JSON \(line 1, column 31"):
        load_base_config(bad)
    with pytest.raises(SettingsError, match="cannot read it"):
        load_base_config(tmp_path / "missing.json")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(SettingsError, match="a DeepSpeed config is a JSON object, got list"):
        load_base_config(listed)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(PRODUCTION))
    assert load_base_config(good) == PRODUCTION


def test_train_batch_size_must_match_the_global_batch() -> None:
    base = {**PRODUCTION, "train_batch_size": 32}
    assert base_global_batch(base, None, "b.json") == 32
    assert base_global_batch(base, 32, "b.json") == 32
    assert base_global_batch(PRODUCTION, 8, "b.json") == 8
    with pytest.raises(
        SettingsError,
        match=r"pins train_batch_size = 32 but --global-batch is 16.*--global-batch 32",
    ):
        base_global_batch(base, 16, "b.json")


@pytest.mark.parametrize(
    ("pins", "key"),
    [
        ({"zero_optimization": {"stage": 2}}, "zero_optimization.stage"),
        ({"bf16": {"enabled": True}}, "bf16.enabled"),
        ({"train_micro_batch_size_per_gpu": 4}, "train_micro_batch_size_per_gpu"),
        ({"gradient_accumulation_steps": 2}, "gradient_accumulation_steps"),
        (
            {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
            "zero_optimization.offload_optimizer.device",
        ),
    ],
)
def test_pinning_a_searched_value_is_refused(pins: dict, key: str) -> None:
    with pytest.raises(SettingsError, match=f"pins {key} = .*which the search varies"):
        check_conflicts({**PRODUCTION, **pins}, bound(), "b.json")


def test_pinning_what_the_space_fixes_is_fine() -> None:
    space = "precision: [bf16]\nzero_stage: [2]\nmicro_batch_size: [4]\n"
    base = {
        **PRODUCTION,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2, "overlap_comm": True},
        "train_micro_batch_size_per_gpu": 4,
    }
    check_conflicts(base, bound(space), "b.json")
    candidate = next(bound(space).candidates())
    config = DEEPSPEED.render_config(candidate, base)
    assert config["zero_optimization"]["overlap_comm"] is True
    assert config["scheduler"] == PRODUCTION["scheduler"]


def test_pinned_knob_conflicts_only_when_searched() -> None:
    base = {**PRODUCTION, "zero_optimization": {"overlap_comm": False}}
    check_conflicts(base, bound(), "b.json")
    searched = (
        "micro_batch_size: [1]\nzero_stage: [2]\nzero_knobs:\n  overlap_comm: [false, true]\n"
    )
    with pytest.raises(SettingsError, match=r"zero_optimization\.overlap_comm"):
        check_conflicts(base, bound(searched), "b.json")


def test_hugging_face_auto_placeholders_are_found() -> None:
    config = {"optimizer": {"params": {"lr": "auto"}}, "fp16": {"enabled": "auto"}, "x": [1]}
    assert find_auto_values(config) == ["optimizer.params.lr", "fp16.enabled"]
