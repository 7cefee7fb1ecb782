"""``autotune verify`` end to end: a study of gpt-tiny whose winner is bf16, its loss check
against the fp32 ZeRO-0 reference on real DeepSpeed CPU ranks, and the verdict as status,
``--json`` and summary.md show it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

# One bf16 candidate: it is the winner, and fp32 ZeRO-0 (not in the space) its reference.
SPACE = """\
precision: [bf16]
zero_stage: [2]
offload_optimizer: [none]
offload_param: [none]
micro_batch_size: [2]
gradient_accumulation_steps: [2]
activation_checkpointing: [false]
"""
RUN = [
    "run", "--workload", "gpt-tiny", "--gpus", "2", "--space", "space.yaml",
    "--global-batch", "8", "--budget", "5m", "--max-trials", "1", "--no-confirm",
    "--warmup-steps", "1", "--timed-steps", "2", "--max-timed-steps", "2", "--no-early-stop",
]  # fmt: skip


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("verify")
    (path / "space.yaml").write_text(SPACE)
    result = run_cli(*RUN, cwd=path)
    assert result.returncode == 0, result.stdout + result.stderr
    return path


def test_verify_checks_the_bf16_winner_against_fp32_zero0(workdir: Path) -> None:
    result = run_cli("verify", "--steps", "4", cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "verifying trial 0 (z2 bf16 mb2x2) against z0 fp32 mb4x1: fp32 at ZeRO-0" in out
    assert "3 run(s) of 4 step(s)" in out
    for role in ("reference", "reference repeat", "winner"):
        assert f"  {role} z" in out
    assert "loss check of trial 0: drifts within the tolerance of bf16" in out

    status = run_cli("status", cwd=workdir)
    assert (
        "loss check of trial 0 (z2 bf16 mb2x2) against z0 fp32 mb4x1, 4 step(s): drifts "
        "within the tolerance of bf16"
    ) in status.stdout

    document = json.loads(run_cli("status", "--json", cwd=workdir).stdout)
    check = document["verification"]["0"]
    assert check["verdict"]["verdict"] == "drifts" and check["reference_rule"] == "fp32 ZeRO-0"
    assert [run["role"] for run in check["runs"]] == ["reference", "reference repeat", "winner"]
    reference, repeat, winner = (run["trace"] for run in check["runs"])
    assert reference["losses"] == repeat["losses"]  # CPU ranks: bitwise reproducible
    assert len(winner["losses"]) == 4 and winner["losses"] != reference["losses"]
    assert reference["initial_weights_sha256"] == winner["initial_weights_sha256"]

    export = run_cli("export", "-o", "out", cwd=workdir)
    assert export.returncode == 0, export.stderr
    summary = (workdir / "out" / "summary.md").read_text()
    assert "## Loss check" in summary
    assert "**drifts within the tolerance of bf16**" in summary
    assert summary.count("\n| 3 | ") == 1  # a row per step, 0 to 3


def test_verify_json_is_one_document_and_replaces_the_trials_check(workdir: Path) -> None:
    result = run_cli("verify", "--trial", "0", "--steps", "2", "--json", cwd=workdir)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)  # the whole of stdout
    assert document["kind"] == "autotune.verify" and document["trial"] == 0
    assert document["steps"] == 2 and document["verdict"]["verdict"] == "drifts"
    assert "loss check of trial 0" in result.stderr  # the progress lines go to stderr
    status = run_cli("status", cwd=workdir)
    assert "against z0 fp32 mb4x1, 2 step(s): drifts" in status.stdout
