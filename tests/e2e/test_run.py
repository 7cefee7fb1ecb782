"""The whole path, as a user runs it: a real study of real DeepSpeed probes on 2 CPU ranks
through Ray and torchrun, checked in SQLite, exported, trained with, continued, shown in
`autotune status` and served by the real optuna-dashboard."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import requests

from autotune.backends.deepspeed import validate_ds_config
from tests.support.cli import run_cli
from tests.support.paths import ROOT
from tests.support.processes import probe_processes

pytestmark = pytest.mark.slow

RUN = [
    "run",
    "--workload",
    "gpt-tiny",
    "--gpus",
    "2",
    "--warmup-steps",
    "1",
    "--timed-steps",
    "3",
    "--max-timed-steps",
    "6",
    "--no-early-stop",  # three COMPLETE trials, so the confirmation round has contenders
    "--base-config",
    "production.json",
    "--space",
    "deepspeed.yaml",
]
# The default space with DeepSpeed alone: this is DeepSpeed's path with a production base
# config and its launchers (a study over both backends is test_fsdp2_study's).
DEEPSPEED_SPACE = (
    (ROOT / "search_spaces" / "default.yaml")
    .read_text()
    .replace("backend: [deepspeed, fsdp2]", "backend: [deepspeed]")
)
# The first run's confirmation round spends what its three probes leave of the budget on
# noisy contenders; the continue raises the study's total so that it has room for its own.
FIRST_BUDGET = ["--budget", "4m"]
CONTINUE_BUDGET = ["--budget", "7m"]
PRODUCTION = {
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
    "gradient_clipping": 1.0,
    "steps_per_print": 100,
}


def evaluated(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [
        t
        for t in study.get_trials()
        if "duplicate_of" not in t.user_attrs and "confirmation_of" not in t.user_attrs
    ]


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("e2e")
    (workdir / "production.json").write_text(json.dumps(PRODUCTION))
    assert "backend: [deepspeed]" in DEEPSPEED_SPACE
    (workdir / "deepspeed.yaml").write_text(DEEPSPEED_SPACE)
    result = run_cli(*RUN, *FIRST_BUDGET, "--max-trials", "3", "--seed", "0", cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no CUDA GPU: running 2 CPU rank(s)" in result.stdout
    assert "exported:" in result.stdout
    (workdir / "first-run.log").write_text(result.stdout)
    return workdir


def load(workdir: Path) -> optuna.Study:
    return optuna.load_study(
        study_name="gpt-tiny", storage=f"sqlite:///{workdir}/trials/autotune.db"
    )


def test_study_records_every_probe(study_dir: Path) -> None:
    trials = evaluated(load(study_dir))
    assert len(trials) == 3
    for trial in trials:
        attrs = trial.user_attrs
        assert attrs["status"] in ("ok", "oom", "error", "timeout")
        assert set(attrs["candidate"]) >= {"precision", "zero_stage", "micro_batch_size"}
        assert attrs["backend_config"]["train_batch_size"] == 16
        assert attrs["probe_wall_s"] > 0
        assert Path(attrs["trial_dir"], "probe.log").is_file()
        if attrs["status"] == "ok":
            assert trial.state == optuna.trial.TrialState.COMPLETE
            assert trial.value == pytest.approx(attrs["samples_per_s"])
            assert attrs["tokens_per_s"] == pytest.approx(64 * attrs["samples_per_s"])
            assert len(attrs["peak_bytes_per_rank"]) == 2
            assert trial.constraints["peak_over_limit_bytes"] < 0
            assert attrs["feasible"] is True
    assert any(t.user_attrs["status"] == "ok" for t in trials)
    assert probe_processes() == []


def test_confirmation_round_decides_the_export(study_dir: Path) -> None:
    from autotune.study import best
    from autotune.study.confirmation import load as load_confirmation

    out = (study_dir / "first-run.log").read_text()
    assert "confirming 3 contender(s), interleaved" in out
    study = load(study_dir)
    verdict = load_confirmation(study)
    assert verdict is not None and verdict.rounds >= 1 and len(verdict.contenders) == 3
    # re-probes are not trials: every trial is an evaluation of its own
    assert len(study.get_trials()) == len(evaluated(study)) == 3
    probed = [
        line.split(": probing ")[1] for line in out.splitlines() if "confirmation: probing" in line
    ]
    # every re-probe is one sample of its contender (a contender that left the race after
    # two rounds has fewer)
    assert len(probed) == sum(len(c.samples_per_s) - 1 for c in verdict.contenders)
    racing_rounds = max(verdict.rounds - 2, 0)
    floor = 3 * min(verdict.rounds, 2) + 2 * racing_rounds + 2 * verdict.tie_rounds
    assert floor <= len(probed)
    # a round cut short, where slow re-probes left no time for the rest, adds at most two
    cut_short = 2
    assert len(probed) <= 3 * verdict.rounds + 2 * verdict.tie_rounds + cut_short
    assert probed[:3] == probed[3:6] or verdict.rounds < 2  # interleaved: A B C A B C
    folders = sorted((study_dir / "trials" / "gpt-tiny").glob("confirm-*"))
    assert len(folders) == len(probed) and all((f / "probe.log").is_file() for f in folders)
    for contender in verdict.contenders:
        # the best two may have had tie-break rounds of their own; one out of the winner's
        # noise after two rounds left the race; a round cut short gave it one more
        extra = len(contender.samples_per_s) - 1 - verdict.rounds
        assert -1 <= extra <= verdict.tie_rounds + 1
    decided = best.of_study(study)
    assert decided is not None and decided.trial == verdict.winner and decided.confirmed
    assert study.user_attrs[best.BEST_ATTR]["trial"] == verdict.winner
    summary = (study_dir / "trials" / "gpt-tiny" / "best" / "summary.md").read_text()
    assert "## Confirmation round" in summary and "(chosen)" in summary


def test_exported_config_is_the_winners_with_the_production_keys(study_dir: Path) -> None:
    best_dir = study_dir / "trials" / "gpt-tiny" / "best"
    path = best_dir / "ds_config.json"
    config = json.loads(path.read_text())
    validate_ds_config(config, world_size=2)
    from autotune.study import best as best_module

    decided = best_module.of_study(load(study_dir))  # the confirmation round's winner
    assert decided is not None
    best = load(study_dir).trials[decided.trial]
    assert best.user_attrs.get("feasible")
    assert config == best.user_attrs["backend_config"]
    for key in ("optimizer", "scheduler", "gradient_clipping", "steps_per_print"):
        assert config[key] == PRODUCTION[key]
    assert (best_dir / "launch.sh").is_file()
    assert f"# autotune: {best.user_attrs['label']}" in (best_dir / "summary.md").read_text()
    # it trains: the launch script test below runs this same config under both launchers


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_export_command_and_launch_script(study_dir: Path, launcher: str) -> None:
    out = study_dir / f"export-{launcher}"
    result = run_cli("export", "-o", str(out), cwd=study_dir, timeout=120)
    assert result.returncode == 0, result.stderr
    assert {p.name for p in out.iterdir()} == {"ds_config.json", "launch.sh", "summary.md"}
    exported = json.loads(
        (study_dir / "trials" / "gpt-tiny" / "best" / "ds_config.json").read_text()
    )
    assert json.loads((out / "ds_config.json").read_text()) == exported  # what `run` wrote
    with socket.socket() as sock:  # the deepspeed launcher's 29500 may be another test's
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "LAUNCHER": launcher,
        "MASTER_PORT": str(port),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    train = subprocess.run(
        [str(out / "launch.sh"), str(ROOT / "tests" / "assets" / "train_with_config.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=study_dir,
    )
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert (train.stdout + train.stderr).count("TRAINED global_steps=2") == 1


def test_status_prints_the_trials(study_dir: Path) -> None:
    result = run_cli("status", cwd=study_dir, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "study gpt-tiny" in out and "samples/s" in out and "* = best (confirmed)" in out
    assert out.count(" ok ") + out.count(" oom ") + out.count(" error ") >= 1


def test_dashboard_serves_the_study(study_dir: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "optuna-dashboard"),
            "sqlite:///trials/autotune.db",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
        ],
        cwd=study_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                studies = requests.get(f"http://127.0.0.1:{port}/api/studies", timeout=5).json()
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, "dashboard did not start"
                time.sleep(0.5)
        (summary,) = [s for s in studies["study_summaries"] if s["study_name"] == "gpt-tiny"]
        detail = requests.get(
            f"http://127.0.0.1:{port}/api/studies/{summary['study_id']}", timeout=30
        ).json()
        assert len(detail["trials"]) >= 3
        assert any(t["user_attrs"] for t in detail["trials"])
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_second_run_continues_without_repeating(study_dir: Path) -> None:
    before = {t.user_attrs["candidate_key"] for t in evaluated(load(study_dir))}
    # the confirmation round has its own test: this one is about continuing
    result = run_cli(
        *RUN, *CONTINUE_BUDGET, "--max-trials", "2", "--seed", "1", "--no-confirm", cwd=study_dir
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 candidate(s) evaluated before" in result.stdout
    trials = evaluated(load(study_dir))
    keys = [t.user_attrs["candidate_key"] for t in trials]
    assert len(trials) == 5
    assert len(set(keys)) == 5, "a candidate was probed twice"
    assert before < set(keys)
