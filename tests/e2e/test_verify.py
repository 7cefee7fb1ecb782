"""``autotune verify`` and ``autotune run --verify`` / ``--verify strict`` end to end on real
DeepSpeed CPU ranks: a study of gpt-tiny whose winner is bf16, its loss check against the
fp32 ZeRO-0 reference, and the verdict as status, ``--json`` and summary.md show it; a model
with BatchNorm whose winner splits the batch finer than its reference differs, by its batch
statistics; and a strict run sets a faster winner that differs aside and exports the
runner-up."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.paths import ASSETS

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
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The study, its best checked by ``run --verify``; the run's output."""
    path = tmp_path_factory.mktemp("verify")
    (path / "space.yaml").write_text(SPACE)
    result = run_cli(*RUN, "--verify", "--quiet", cwd=path)
    assert result.returncode == 0, result.stdout + result.stderr
    return path, result.stdout


@pytest.fixture(scope="module")
def workdir(study: tuple[Path, str]) -> Path:
    return study[0]


def test_run_with_verify_checks_the_best_before_its_export(study: tuple[Path, str]) -> None:
    path, out = study
    assert "verifying trial 0 (z2 bf16 mb2x2) against z0 fp32 mb4x1" in out
    assert "loss check of trial 0: drifts within the tolerance of bf16" in out
    assert out.index("loss check of trial 0") < out.index("exported: ")
    summary = (path / "trials" / "gpt-tiny" / "best" / "summary.md").read_text()
    assert "**drifts within the tolerance of bf16**" in summary


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


# fp32 ZeRO-0 at micro-batch 2 (of a global batch of 8 on 2 ranks): the reference trains
# the rank's 4 samples as one micro-batch, so BatchNorm normalises over 4 samples, not 2.
SPLIT_SPACE = SPACE.replace("[bf16]", "[fp32]").replace("zero_stage: [2]", "zero_stage: [0]")


def test_batch_statistics_at_a_smaller_micro_batch_differ(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text(SPLIT_SPACE)
    workload = f"{ASSETS / 'batchnorm_workload.py'}:make"
    run = run_cli(*[workload if a == "gpt-tiny" else a for a in RUN], cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    result = run_cli("verify", "--steps", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "verifying trial 0 (z0 fp32 mb2x2) against z0 fp32 mb4x1" in result.stdout
    assert (
        "loss check of trial 0: differs: step 0, loss " in result.stdout
        and "likely cause: micro-batch-dependent statistics" in result.stdout
    ), result.stdout


# fp32 ZeRO-0 at two splits of 1024 samples per rank. The workload mixes the samples of a
# micro-batch (attention over them, then BatchNorm): it costs the square of the micro-batch,
# so micro-batch 256 (x4) is the faster, and it trains differently from its reference, 1024.
MIXING_SPACE = """\
precision: [fp32]
zero_stage: [0]
offload_optimizer: [none]
offload_param: [none]
micro_batch_size: [256, 1024]
gradient_accumulation_steps: [1, 4]
activation_checkpointing: [false]
"""


def test_verify_strict_exports_the_runner_up_when_the_winner_differs(tmp_path: Path) -> None:
    (tmp_path / "space.yaml").write_text(MIXING_SPACE)
    workload = f"{ASSETS / 'batch_mixing_workload.py'}:make"
    result = run_cli(
        "run", "--workload", workload, "--gpus", "2", "--space", "space.yaml", "--budget", "5m",
        "--no-confirm", "--warmup-steps", "1", "--timed-steps", "3", "--max-timed-steps", "3",
        "--no-early-stop", "--quiet", "--verify", "strict", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    # the faster split is checked first, differs and is set aside; its runner-up, the
    # reference's own configuration, trains the same and is exported
    split = re.search(r"verifying trial (\d) \(z0 fp32 mb256x4\) against z0 fp32 mb1024x1", out)
    whole = re.search(r"verifying trial (\d) \(z0 fp32 mb1024x1\) against z0 fp32 mb1024x1", out)
    assert split and whole and split.start() < whole.start(), out
    differs = f"loss check of trial {split[1]}: differs: step 0, loss "
    assert differs in out and "likely cause: micro-batch-dependent statistics" in out
    assert "set aside (--verify strict): the next best is checked" in out
    assert f"loss check of trial {whole[1]}: trains the same" in out
    assert f"best: trial {whole[1]} z0 fp32 mb1024x1" in out
    summary = (tmp_path / "trials" / "batch-mixing" / "best" / "summary.md").read_text()
    assert "# autotune: z0 fp32 mb1024x1" in summary
    aside = f"- Set aside by its loss check (`--verify strict`): trial {split[1]} (z0 fp32 mb256x4)"
    assert aside in summary
    status = run_cli("status", cwd=tmp_path).stdout
    assert "(set aside by --verify strict: never the best)" in status
