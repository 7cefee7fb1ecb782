"""A user's script and its arguments: what autotune reads, what it rewrites per candidate,
what the export hands the shell, and the project file (no probes; fast)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from autotune.candidate import Candidate
from autotune.errors import SettingsError
from autotune.script_config import parse_script, set_flag, set_switch


def _candidate(**values: object) -> Candidate:
    base = {
        "precision": "bf16",
        "zero_stage": 2,
        "micro_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "data_parallel_size": 2,
    }
    return Candidate.model_validate({**base, **values})


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "ds_config.json").write_text(json.dumps({"train_batch_size": "auto"}))
    return tmp_path


HF_ARGS = [
    "--deepspeed", "ds_config.json", "--output_dir", "out",
    "--per_device_train_batch_size", "4", "--gradient_accumulation_steps=2", "--fp16", "true",
]  # fmt: skip


def test_a_trainer_script_gets_its_own_flags_per_candidate(folder: Path) -> None:
    script = parse_script("train.py", HF_ARGS, [], cwd=folder)
    assert script.kind == "hf" and script.config_flag == "--deepspeed"
    assert script.config_path == str((folder / "ds_config.json").resolve())
    argv = script.argv(_candidate(activation_checkpointing=True), "/t/cfg.json", cpu=True)
    assert argv == [
        "--deepspeed", "/t/cfg.json", "--output_dir", "out",
        "--per_device_train_batch_size", "8", "--gradient_accumulation_steps=1",
        "--gradient_checkpointing", "--bf16", "--use_cpu",
    ]  # fmt: skip
    changes = script.changes(_candidate(), "ds_config.json")
    assert "`--per_device_train_batch_size` 4 -> 8" in changes
    assert "`--fp16 true` removed" in changes and "`--bf16` added" in changes


def test_a_deepspeed_script_keeps_its_arguments_but_the_config(folder: Path) -> None:
    args = ["--deepspeed", "--deepspeed_config", "ds_config.json", "--epochs", "3"]
    script = parse_script("train.py", args, ["micro_batch_size=--batch-size"], cwd=folder)
    assert script.kind == "deepspeed" and script.config_flag == "--deepspeed_config"
    assert script.flags == {"micro_batch_size": "--batch-size"}
    argv = script.argv(_candidate(precision="fp32", micro_batch_size=2), "c.json", cpu=True)
    assert argv == [*args[:2], "c.json", "--epochs", "3", "--batch-size", "2"]


@pytest.mark.parametrize(
    ("path", "args", "mappings", "words"),
    [
        ("missing.py", [], [], "--script missing.py: no such file"),
        ("deepspeed", [], [], "give your training script, not a launcher"),
        ("train.py", ["--num_gpus", "2"], [], "--num_gpus is a launcher flag"),
        ("train.py", ["--local_rank=0"], [], "--local_rank is a launcher flag"),
        ("train.py", ["--deepspeed", "nope.json"], [], "--deepspeed nope.json: no such file"),
        ("train.py", [], ["batch=--bs"], "--script-arg batch=--bs: give DIMENSION=--flag"),
    ],
)
def test_what_autotune_cannot_run_is_one_line(
    folder: Path, path: str, args: list[str], mappings: list[str], words: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        parse_script(path, args, mappings, cwd=folder)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_flags_and_switches_are_replaced_in_place() -> None:
    assert set_flag(["--a", "1", "--a=2", "x"], "--a", "3") == ["--a", "3", "x"]
    assert set_flag(["x"], "--a", "3") == ["x", "--a", "3"]
    assert set_switch(["--s", "false", "--t"], "--s", True) == ["--s", "--t"]
    assert set_switch(["--s=true", "--t"], "--s", False) == ["--t"]


def test_launch_sh_quotes_every_argument(folder: Path) -> None:
    """Arguments come from the storage: none may run as shell code."""
    from autotune.export._script_export import render_script_launch
    from autotune.study.records import TrialRecord, TrialView
    from autotune.study.storage import StudyConfig

    hostile = ["--deepspeed", "ds_config.json", "--name", "$(touch INJECTED); `x`"]
    script = parse_script("train.py", hostile, [], cwd=folder)
    config = StudyConfig(
        workload=f"script:{script.path}",
        space={},
        accelerator="cpu",
        gpus_per_trial=2,
        global_batch=16,
        vram_limit_bytes=2**30,
        script=script,
    )
    candidate = _candidate()
    record = TrialRecord(candidate=candidate, label=candidate.label)
    text = render_script_launch("s", TrialView(0, "COMPLETE", 1.0, record, None), config)  # type: ignore[arg-type]
    launch = folder / "launch.sh"
    launch.write_text(
        text.replace("exec torchrun", "exec echo").replace("exec deepspeed", "exec echo")
    )
    out = subprocess.run(["bash", str(launch)], capture_output=True, text=True, check=True).stdout
    assert "$(touch INJECTED); `x`" in out and not (folder / "INJECTED").exists()
    assert f"--deepspeed {folder}/ds_config.json" in out  # the exported config, beside launch.sh
    assert "--per_device_train_batch_size 8" in out and "--bf16 --use_cpu" in out


def test_project_file_layers_under_the_flags(folder: Path) -> None:
    from autotune.cli._project import layer

    (folder / "autotune.yaml").write_text(
        "script: train.py\nscript-args: --deepspeed ds_config.json --output_dir out\n"
        "gpus: 2\nbudget: 2h\nglobal_batch: 16\n"
    )
    merged, name = layer({"budget": "5m", "gpus": None}, folder)
    assert name == "autotune.yaml"
    assert merged["budget"] == "5m" and merged["gpus"] == "2" and merged["global_batch"] == "16"
    assert merged["script_args"] == ["--deepspeed", "ds_config.json", "--output_dir", "out"]
    merged, _ = layer({"workload": "gpt-tiny"}, folder)  # a workload replaces the script
    assert "script" not in merged and "script_args" not in merged


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("script: train.py\ncolour: red\n", "autotune.yaml: unknown key 'colour'"),
        ("budget: 2x\n", "autotune.yaml: --budget: cannot read duration '2x'"),
        ("- a\n- b\n", "autotune.yaml: must map flags to values"),
        ("inject_fault: crash\n", "autotune.yaml: unknown key 'inject_fault'"),
    ],
)
def test_a_bad_project_file_is_one_line_naming_it(folder: Path, text: str, words: str) -> None:
    from autotune.cli._project import project_flags

    (folder / "autotune.yaml").write_text(text)
    with pytest.raises(SettingsError) as caught:
        project_flags(folder)
    assert words in str(caught.value)


def test_pyproject_table(folder: Path) -> None:
    from autotune.cli._project import project_flags

    (folder / "pyproject.toml").write_text('[tool.autotune]\nworkload = "gpt-tiny"\ngpus = 2\n')
    assert project_flags(folder) == (
        {"workload": "gpt-tiny", "gpus": "2"},
        "pyproject.toml [tool.autotune]",
    )


def test_init_writes_a_commented_file_that_runs(folder: Path) -> None:
    from autotune.cli._project import init, project_flags

    path = init("train.py", HF_ARGS, gpus=2, folder=folder)
    text = path.read_text()
    assert text.count("#") > 10 and "global_batch: 16" in text  # 4 x 2 x 2 ranks
    flags, _ = project_flags(folder)
    assert flags["script"] == "train.py" and flags["script_args"] == HF_ARGS
    with pytest.raises(SettingsError, match="exists"):
        init("train.py", [], gpus=2, folder=folder)
