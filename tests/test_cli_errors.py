"""Bad input: one clear line on stderr, exit code 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli

BAD_INPUTS = [
    (
        ["run", "--workload", "gpt-tiny", "--gpus", "2", "--budget", "2x"],
        "--budget: cannot read duration '2x'",
    ),
    (["run", "--workload", "gpt-tiny", "--gpus", "0"], "--gpus: input should be greater than 0"),
    (
        ["run", "--workload", "gpt-huge", "--gpus", "1"],
        "unknown workload 'gpt-huge'; known: gpt-tiny, gpt2",
    ),
    (
        ["run", "--workload", "gpt-tiny", "--space", "missing.yaml"],
        "--space missing.yaml: no such file",
    ),
    (
        ["run", "--workload", "gpt-tiny", "--space", "bad_key.yaml"],
        "bad_key.yaml:2: unknown key 'colour'; allowed keys:",
    ),
    (["run", "--workload", "gpt-tiny", "--vram", "lots"], "--vram: cannot read size 'lots'"),
    (["run", "--workload", "gpt-tiny", "--gpus", "two"], "Invalid value for '--gpus'"),
    (["run", "--workload", "gpt-tiny", "--colour", "red"], "No such option: --colour"),
    (["run", "--workload", "no_such_file.py:make"], "file no_such_file.py does not exist"),
    (["run", "--workload", "broken.py:make"], "importing broken.py failed with ZeroDivisionError"),
    (
        ["run", "--workload", "gpt-tiny", "--executor", "slurm"],
        "--executor: input should be 'ray' or 'local', got 'slurm'",
    ),
    (["run"], "--workload is required"),
    (["status", "--storage", "sqlite:///nowhere/x.db", "--study", "s"], "no such study"),
    (
        ["run", "--workload", "gpt-tiny", "--space", "fp8.yaml"],
        "fp8.yaml:1: precision[1]: Input should be 'fp32', 'bf16' or 'fp16', got 'fp8'",
    ),
    (
        ["run", "--workload", "gpt-tiny", "--space", "param_z2.yaml"],
        "offload_param 'cpu' needs zero_stage 3",
    ),
    (
        ["run", "--workload", "gpt-tiny", "--space", "nvme.yaml"],
        "offload_optimizer lists only 'nvme', but it needs --nvme-path DIR",
    ),
    (
        ["run", "--workload", "gpt-tiny", "--base-config", "not_json.json"],
        "--base-config not_json.json: not valid JSON (line 1",
    ),
    (
        ["run", "--workload", "gpt-tiny", "--base-config", "batch32.json", "--global-batch", "16"],
        "pins train_batch_size = 32 but --global-batch is 16",
    ),
    (
        ["run", "--workload", "gpt-tiny", "--global-batch", "lots"],
        "--global-batch lots: give a positive integer or 'auto'",
    ),
    (
        ["run", "--workload", "gpt-tiny", "--global-batch", "auto"],
        "--global-batch auto needs --max-global-batch N",
    ),
    (
        ["run", "--workload", "gpt-tiny", "--nvme-path", "no/such/dir"],
        "--nvme-path no/such/dir: not a writable folder",
    ),
    (["export", "-o", "out", "--storage", "sqlite:///x.db", "--study", "s"], "no such study"),
    (["space", "--space", "fp8.yaml"], "fp8.yaml:1: precision[1]"),
    (["frobnicate"], "No such command 'frobnicate'"),
    (["run", "--workload", "gpt-tiny", "--gpus", "64"], "CPU cores; pass --gpus"),
    (
        ["run", "--workload", "gpt-tiny", "--gpus", "2", "--gpus-per-trial", "3"],
        "--gpus-per-trial 3 exceeds --gpus 2",
    ),
    (["run", "--study", "nosuch"], "--study nosuch: no such study in"),
    (
        ["run", "--workload", "gpt-tiny", "--storage", "postgresql+psycopg2://u:p@127.0.0.1:9/db"],
        "--storage postgresql+psycopg2://u:p@127.0.0.1:9/db: cannot open",
    ),
    (
        ["run", "--workload", "gpt-tiny", "--probe-timeout", "soon"],
        "--probe-timeout: cannot read duration 'soon'",
    ),
    (
        ["run", "--workload", "gpt-tiny", "--memory-margin", "1.5"],
        "--memory-margin: input should be less than 1",
    ),
    (["plan", "--workload", "gpt-tiny", "--gpus", "2", "--vram", "2x"], "--vram: cannot read size"),
    (["plan", "--workload", "nope", "--gpus", "1", "--vram", "8GiB"], "unknown workload 'nope'"),
    (["run", "--workload", "gpt-tiny", "--sampler", "bayes"], "--sampler: input should be"),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bad-input")
    (path / "bad_key.yaml").write_text("precision: [fp32]\ncolour: [red]\nmicro_batch_size: [1]\n")
    (path / "broken.py").write_text("x = 1 / 0\n")
    (path / "fp8.yaml").write_text("precision: [fp32, fp8]\nmicro_batch_size: [1]\n")
    (path / "param_z2.yaml").write_text(
        "zero_stage: [2]\noffload_param: [cpu]\nmicro_batch_size: [1]\n"
    )
    (path / "nvme.yaml").write_text("offload_optimizer: [nvme]\nmicro_batch_size: [1]\n")
    (path / "not_json.json").write_text("optimizer: {type: Adam}\n")
    (path / "batch32.json").write_text('{"train_batch_size": 32}')
    return path


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS, ids=lambda v: str(v)[:40])
def test_bad_input_is_one_line_exit_2(args: list[str], message: str, workdir: Path) -> None:
    result = run_cli(*args, cwd=workdir, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("autotune: error: ")
    assert message in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_debug_shows_the_traceback(workdir: Path) -> None:
    result = run_cli("--debug", "run", "--workload", "gpt-tiny", "--budget", "2x", cwd=workdir)
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "SettingsError" in result.stderr


def test_probe_text_with_brackets_prints_as_is(capsys: pytest.CaptureFixture[str]) -> None:
    """A probe's error quotes gloo ("[/__w/.../pair.cc:553]"); rich markup would raise
    MarkupError on it and the run would die with a traceback."""
    from rich.table import Table

    from autotune.cli import console

    line = "trial 0: z0 fp32 mb8x1 -> error ([/__w/gloo/transport/tcp/pair.cc:553] closed)"
    console.print(line)
    table = Table("error")
    table.add_row("[/pair.cc:553] [bold]")
    console.print(table)
    out = capsys.readouterr().out
    assert line in out and "[/pair.cc:553] [bold]" in out
