"""Bad input: one clear line on stderr, exit code 2, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import run_cli

# The full table of bad inputs is tests/test_bad_input.py (in-process, through
# autotune.cli.main); these few go through a real process, as a user's shell runs them:
# exit code, stderr and no traceback as the operating system sees them.
BAD_INPUTS = [
    (
        ["run", "--workload", "gpt-tiny", "--gpus", "2", "--budget", "2x"],
        "--budget: cannot read duration '2x'",
    ),
    (["run", "--workload", "gpt-tiny", "--gpus", "two"], "--gpus two: give a number of GPUs"),
    (["run", "--workload", "gpt-tiny", "--colour", "red"], "No such option: --colour"),
    (["run"], "is required for a new study"),
    (["run", "--workload", "broken.py:make"], "importing broken.py failed with ZeroDivisionError"),
    (
        ["run", "--workload", "gpt-tiny", "--storage", "postgresql+psycopg2://u:p@127.0.0.1:9/db"],
        "--storage postgresql+psycopg2://u:***@127.0.0.1:9/db: cannot open",
    ),
    (["frobnicate"], "No such command 'frobnicate'"),
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bad-input")
    (path / "broken.py").write_text("x = 1 / 0\n")
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

    from autotune.cli._app import console

    line = "trial 0: z0 fp32 mb8x1 -> error ([/__w/gloo/transport/tcp/pair.cc:553] closed)"
    console.print(line)
    table = Table("error")
    table.add_row("[/pair.cc:553] [bold]")
    console.print(table)
    out = capsys.readouterr().out
    assert line in out and "[/pair.cc:553] [bold]" in out
