"""``autotune run --verify`` and ``autotune verify`` of a user's script on real DeepSpeed CPU
ranks (``tests/assets/token_loss_script.py``): the loss the script hands to
``engine.backward`` compared between its own config (the reference) and a winner that
splits the batch finer; how the script trains is switched per check through its
``token_loss.json``, so that one study serves every case.

- a loss averaged per micro-batch over a token count that varies differs at accumulation 2,
  cause loss normalisation;
- the same script normalising over the step's tokens trains the same;
- (a data order the script does not reproduce, "cannot judge", is
  ``tests/study/test_loss_runs.py``'s, on the digests these runs record);
- the first Ctrl-C stops a running check: nothing recorded, exit 130.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.paths import ASSETS

pytestmark = pytest.mark.slow

CONFIG = {
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
    "steps_per_print": 1000000,
}
# the winner splits each rank's 4 samples in 2 micro-batches; the script's config, 1
SPACE = """\
precision: [fp32]
zero_stage: [0]
offload_optimizer: [none]
offload_param: [none]
micro_batch_size: [2]
gradient_accumulation_steps: [2]
activation_checkpointing: [false]
"""
STEPS = "4"


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A one-trial study of the script, checked by ``run --verify`` (the script as it
    comes: per-micro-batch normalisation); its output."""
    path = tmp_path_factory.mktemp("verify-script")
    (path / "ds_config.json").write_text(json.dumps(CONFIG))
    (path / "space.yaml").write_text(SPACE)
    (path / "train.py").write_text((ASSETS / "token_loss_script.py").read_text())
    result = run_cli(
        "run", "--script", "train.py", "--gpus", "2", "--space", "space.yaml", "--budget", "5m",
        "--max-trials", "1", "--no-confirm", "--warmup-steps", "1", "--timed-steps", "2",
        "--max-timed-steps", "2", "--no-early-stop", "--quiet", "--verify",
        "--", "--deepspeed_config", "ds_config.json", cwd=path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return path, result.stdout


def check(folder: Path, **settings: object) -> subprocess.CompletedProcess[str]:
    (folder / "token_loss.json").write_text(json.dumps(settings))
    return run_cli("verify", "--steps", STEPS, cwd=folder)


def test_a_loss_averaged_per_micro_batch_differs_at_accumulation(study: tuple[Path, str]) -> None:
    folder, out = study
    assert (
        "verifying trial 0 (z0 fp32 mb2x2) against z0 fp32 mb4x1: your base config as "
        "DeepSpeed reads it (z0 fp32 mb4x1)"
    ) in out
    assert "loss check of trial 0: differs: step 0, loss " in out, out
    assert "likely cause: loss normalisation" in out
    assert out.index("loss check of trial 0") < out.index("exported: ")
    summary = (folder / "trials" / "train" / "best" / "summary.md").read_text()
    assert "**differs: step 0" in summary
    assert "Your script ran as it is: autotune seeded python, numpy and torch" in summary
    assert "each step's samples were the same in every run" in summary
    document = json.loads(run_cli("status", "--json", cwd=folder).stdout)
    runs = document["verification"]["0"]["runs"]
    reference, repeat, winner = (run["trace"] for run in runs)
    # the same weights and, step by step, the same samples: only the split differs
    assert reference["initial_weights_sha256"] == winner["initial_weights_sha256"]
    assert reference["sample_digests"] == repeat["sample_digests"] == winner["sample_digests"]
    assert len(set(reference["sample_digests"])) == len(reference["sample_digests"])
    assert reference["losses"] == repeat["losses"]
    assert all(norm is not None for norm in winner["grad_norms"])  # fp32 ZeRO-0: its own


def test_a_loss_normalised_over_the_step_trains_the_same(study: tuple[Path, str]) -> None:
    folder, _ = study
    result = check(folder, normalise="step")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "loss check of trial 0: trains the same" in result.stdout, result.stdout


def test_the_first_ctrl_c_stops_a_running_check_and_records_nothing(
    study: tuple[Path, str],
) -> None:
    folder, _ = study
    before = json.loads(run_cli("status", "--json", cwd=folder).stdout)["verification"]
    (folder / "token_loss.json").write_text(json.dumps({"sleep_s": 120}))
    process = subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", "verify", "--steps", STEPS],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    spec = folder / "trials" / "train" / "verify-0000" / "reference" / "spec.json"
    deadline = time.monotonic() + 120
    while not spec.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
    time.sleep(3)  # the script's ranks are sleeping before deepspeed.initialize
    process.send_signal(signal.SIGINT)
    started = time.monotonic()
    out, err = process.communicate(timeout=60)
    assert time.monotonic() - started < 30, "the check did not stop on the first Ctrl-C"
    assert process.returncode == 130, out + err
    assert "loss check of trial 0 interrupted: nothing recorded" in out
    assert "autotune: error: the loss check of trial 0 was interrupted: nothing recorded" in err
    after = json.loads(run_cli("status", "--json", cwd=folder).stdout)["verification"]
    assert after == before
