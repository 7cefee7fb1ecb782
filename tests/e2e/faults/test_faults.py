"""Faults a long tuning run meets, driven through the real CLI in subprocesses: the driver
killed with -9 or interrupted, hung / crashed / out-of-memory probes, a second driver,
changed settings, budgets across runs, an unwritable trials/ folder. Each checks the exit
code, the message, the study's trial states and that no probe process is left behind.

The hang, crash and OOM faults are injected with the probe's test-only fault option
(``--inject-fault``, hidden from --help); everything else is real."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from autotune.units import format_bytes
from tests.e2e.faults.conftest import (
    Driver,
    assert_no_probe_left,
    evaluated,
    load,
    wait_for,
)
from tests.support.cli import run_cli
from tests.support.cli_study import base_args

pytestmark = pytest.mark.slow

# Continue the measured study with every probe hanging until killed.
HUNG = ["run", "--study", "gpt-tiny", "--inject-fault", "hang", "--probe-timeout", "10m"]
# Continue it for one probe, with a total the earlier runs cannot have used up.
CONTINUE = ["--executor", "local", "--max-trials", "1", "--budget", "30m"]


def status_of(trial: optuna.trial.FrozenTrial) -> str:
    from autotune.study.records import TrialView

    return TrialView.of(trial).status


def _nothing_exported(result: subprocess.CompletedProcess[str]) -> None:
    """A run with no feasible configuration exits 3 and says why in one line."""
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune: error: nothing exported: ")
    assert "Traceback" not in result.stdout + result.stderr


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune: error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return lines[0]


def test_kill_9_during_a_probe_then_continue(copy_of_measured: Path) -> None:
    workdir = copy_of_measured
    before = {t.number: t.user_attrs["candidate_key"] for t in evaluated(load(workdir))}
    # Ray executor (the default): the probe is a grandchild of a Ray actor.
    driver = Driver(
        [*HUNG, "--executor", "ray"],
        workdir,
    )
    driver.wait_probing()
    driver.kill()  # SIGKILL to the driver's session: no handler runs
    assert_no_probe_left(timeout_s=60)
    running = [t for t in load(workdir).get_trials() if t.state == TrialState.RUNNING]
    assert len(running) == 1
    lost = running[0]

    # A new total: the retry must not depend on how much of the fixture's 3 minutes the
    # measured study and the hung driver used on a loaded machine.
    result = run_cli("run", "--study", "gpt-tiny", *CONTINUE, cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"trial(s) {lost.number} were left running by a stopped driver" in result.stdout
    assert "taking over study 'gpt-tiny' from a stopped driver" in result.stdout
    trials = evaluated(load(workdir))
    dead = next(t for t in trials if t.number == lost.number)
    assert dead.state == TrialState.FAIL and status_of(dead) == "interrupted"
    retries = [t for t in trials if t.user_attrs.get("retry_of") == lost.number]
    assert len(retries) == 1 and retries[0].user_attrs["status"] == "ok", result.stdout
    assert retries[0].user_attrs["candidate_key"] == lost.user_attrs["candidate_key"]
    # completed trials are still there, and none was probed again
    for number, key in before.items():
        assert trials[number].user_attrs["candidate_key"] == key
    keys = [t.user_attrs["candidate_key"] for t in trials if t.number != lost.number]
    assert len(keys) == len(set(keys))
    assert_no_probe_left()

    # Probed again once only: the retry being interrupted too, nothing is retried again.
    again = run_cli("run", "--study", "gpt-tiny", *CONTINUE, cwd=workdir)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "probed again" not in again.stdout
    waiting = [t for t in load(workdir).get_trials() if t.state == TrialState.WAITING]
    assert waiting == []


def test_second_driver_is_refused_then_ctrl_c_stops_the_first(copy_of_measured: Path) -> None:
    workdir = copy_of_measured
    driver = Driver(
        [*HUNG, "--executor", "ray"],
        workdir,
    )
    try:
        driver.wait_probing()
        second = run_cli(
            "run", "--study", "gpt-tiny", "--executor", "local", cwd=workdir, timeout=120
        )
        line = _one_error_line(second)
        assert "is being run by another driver" in line
        assert f"pid {driver.process.pid} on host {socket.gethostname()}" in line
        assert "--study NEW_NAME" in line

        driver.ctrl_c()
        code = driver.wait(timeout_s=90)
    finally:
        driver.kill()
    out = driver.output
    assert code == 130, out
    assert "interrupt: stopping" in out
    assert "continue with: autotune run --study gpt-tiny" in out
    assert "Traceback" not in out
    assert_no_probe_left()
    study = load(workdir)
    interrupted = [t for t in study.get_trials() if status_of(t) == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0].state == TrialState.FAIL
    # queued once more for the next run, by Optuna's retry callback
    (queued,) = [t for t in study.get_trials() if t.state == TrialState.WAITING]
    assert queued.params == interrupted[0].params
    assert not [t for t in study.get_trials() if t.state == TrialState.RUNNING]
    # the best so far was exported, and the lock was given back
    assert (workdir / "trials" / "gpt-tiny" / "best" / "ds_config.json").exists()
    assert not study.user_attrs.get("autotune_driver")


def test_second_ctrl_c_exits_at_once(copy_of_measured: Path) -> None:
    workdir = copy_of_measured
    driver = Driver(
        [
            "run",
            "--study",
            "gpt-tiny",
            "--inject-fault",
            "hang",
            "--probe-timeout",
            "10m",
            "--executor",
            "local",
        ],
        workdir,
    )
    try:
        driver.wait_probing()
        driver.ctrl_c()
        # The hung rank ignores SIGTERM, so the orderly stop waits out a kill grace period;
        # the second Ctrl-C comes during it.
        wait_for(lambda: "interrupt: stopping" in driver.output, 30, "the first Ctrl-C")
        driver.ctrl_c()
        code = driver.wait(timeout_s=10)
    finally:
        driver.kill()
    assert code == 130, driver.output
    assert "interrupted twice: exiting now" in driver.output
    assert_no_probe_left()
    # the storage is intact: the earlier trials load, and a continue works
    assert len([t for t in evaluated(load(workdir)) if t.state == TrialState.COMPLETE]) == 2
    result = run_cli(
        "run", "--study", "gpt-tiny", "--executor", "local", "--max-trials", "1", cwd=workdir
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hung_probe_is_killed_at_the_timeout(tmp_path: Path) -> None:
    args = base_args(
        tmp_path,
        "--executor",
        "local",
        "--max-trials",
        "1",
        "--inject-fault",
        "hang",
        "--probe-timeout",
        "25s",  # whether the hang comes before or after the ranks are up, it is a timeout
        "--budget",
        "5m",
    )
    result = run_cli(*args, cwd=tmp_path, timeout=300)
    assert "timeout: probe did not finish within its timeout" in result.stdout
    (trial,) = evaluated(load(tmp_path))
    assert trial.state == TrialState.FAIL and trial.user_attrs["status"] == "timeout"
    _nothing_exported(result)
    assert_no_probe_left()


def test_crashed_probe_is_an_error_with_its_log_and_retry_failed_probes_it_again(
    tmp_path: Path,
) -> None:
    args = base_args(
        tmp_path,
        "--executor",
        "local",
        "--max-trials",
        "1",
        "--inject-fault",
        "crash",
        "--budget",
        "5m",
    )
    result = run_cli(*args, cwd=tmp_path, timeout=300)
    _nothing_exported(result)
    (trial,) = evaluated(load(tmp_path))
    assert trial.state == TrialState.FAIL and trial.user_attrs["status"] == "error"
    # the rank that died is named, with torchrun's account of it
    assert "wrote no report" in trial.user_attrs["error"]
    assert "exit code" in trial.user_attrs["error"]
    assert (Path(trial.user_attrs["trial_dir"]) / "probe.log").exists()
    assert "SIGKILL" in trial.user_attrs["log_tail"]  # torchrun's report of the dead rank
    assert_no_probe_left()
    # the cause fixed (no fault injected), --retry-failed probes the candidate once more
    again = ("run", "--study", "gpt-tiny", "--retry-failed", "--max-trials", "1")
    result = run_cli(*again, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"requeued 1 failed candidate(s): trial(s) {trial.number}" in result.stdout
    (retry,) = [t for t in evaluated(load(tmp_path)) if t.number != trial.number]
    assert retry.user_attrs["status"] == "ok", retry.user_attrs
    assert retry.params == trial.params
    assert retry.system_attrs["failed_trial"] == trial.number
    assert retry.user_attrs["retry_of"] == trial.number
    assert_no_probe_left()


def test_oom_is_infeasible_and_rules_out_larger_micro_batches(tmp_path: Path) -> None:
    # The grid goes up from micro-batch 1: its OOM rules out 2, 4 and 8 without a probe.
    args = base_args(
        tmp_path, "--executor", "local", "--inject-fault", "oom", "--budget", "6m", "--sampler",
        "grid",
    )  # fmt: skip
    result = run_cli(*args, cwd=tmp_path, timeout=600)
    _nothing_exported(result)
    assert "every valid candidate has been evaluated" in result.stdout
    trials = evaluated(load(tmp_path))
    assert len(trials) == 4  # micro-batch 1, 2, 4, 8 of one shape
    probed = [t for t in trials if "probe_wall_s" in t.user_attrs]
    ruled_out = [t for t in trials if "oom at micro-batch" in t.user_attrs.get("pruned_by", "")]
    assert [t.user_attrs["status"] for t in probed] == ["oom"]
    assert len(ruled_out) == 3
    for trial in trials:
        assert trial.state == TrialState.PRUNED  # infeasible, never "failed", never best
        assert trial.constraints["peak_over_limit_bytes"] > 0
    for trial in ruled_out:
        oom_trial = trials[trial.user_attrs["oom_trial"]]
        assert oom_trial.number < trial.number
        larger = trial.user_attrs["candidate"]["micro_batch_size"]
        assert larger > oom_trial.user_attrs["candidate"]["micro_batch_size"]
    assert len(probed) + len(ruled_out) == 4
    assert_no_probe_left()


def test_changed_settings_are_refused_with_each_difference(copy_of_measured: Path) -> None:
    workdir = copy_of_measured
    before = len(load(workdir).get_trials())
    result = run_cli(
        "run",
        "--study",
        "gpt-tiny",
        "--vram",
        "1GiB",
        "--global-batch",
        "32",
        cwd=workdir,
        timeout=120,
    )
    line = _one_error_line(result)
    assert "was measured with other settings" in line
    # the study's --vram auto: this machine's RAM shared by its 2 ranks
    auto = format_bytes(psutil.virtual_memory().total // 2)
    assert f"--vram: study has {auto}, this run asks 1.00 GiB" in line
    assert "--global-batch: study has 16, this run asks 32" in line
    assert "--study NEW_NAME" in line
    assert len(load(workdir).get_trials()) == before
    # another workload is another study by default; the same name refuses it
    other = run_cli("run", "--study", "gpt-tiny", "--workload", "gpt2", cwd=workdir, timeout=120)
    assert "--workload: study has 'gpt-tiny', this run asks 'gpt2'" in _one_error_line(other)


def test_budget_is_the_studys_across_runs(copy_of_measured: Path) -> None:
    workdir = copy_of_measured
    budget = load(workdir).user_attrs["autotune_budget"]
    assert budget["total_s"] == 180 and budget["spent_s"] > 0  # the first run's time, stored

    # no --budget: the study's 3m total holds, less what was spent
    result = run_cli(
        "run", "--study", "gpt-tiny", "--executor", "local", "--max-trials", "1", cwd=workdir
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "budget 3m, " in result.stdout and " spent before" in result.stdout
    after = load(workdir).user_attrs["autotune_budget"]
    assert after["total_s"] == 180 and after["spent_s"] > budget["spent_s"]

    # --budget sets a new total: below what is spent, nothing is probed
    small = run_cli("run", "--study", "gpt-tiny", "--budget", "10s", cwd=workdir)
    assert small.returncode == 0, small.stdout + small.stderr
    assert "budget spent" in small.stdout and "0 probe(s)" in small.stdout
    assert "--budget" in small.stdout  # says how to go on
    assert load(workdir).user_attrs["autotune_budget"]["total_s"] == 10
    trials_before = len(evaluated(load(workdir)))
    # and that new total is the study's from now on
    again = run_cli("run", "--study", "gpt-tiny", cwd=workdir)
    assert again.returncode == 0 and "budget spent" in again.stdout
    assert len(evaluated(load(workdir))) == trials_before


def _read_only_folder(path: Path) -> None:
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        return
    # root ignores permission bits: mount a read-only tmpfs there instead
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"running as root and cannot mount a read-only tmpfs: {mounted.stderr}")


def test_read_only_trials_folder_is_one_clear_error(tmp_path: Path) -> None:
    trials = tmp_path / "trials"
    _read_only_folder(trials)
    try:
        result = run_cli(*base_args(tmp_path, "--executor", "local"), cwd=tmp_path, timeout=120)
        line = _one_error_line(result)
        assert "trials" in line and ("read-only" in line.lower() or "cannot" in line)
        # an explicit --trials-dir that cannot be written is named as such
        other = run_cli(
            *base_args(tmp_path, "--executor", "local"),
            "--storage",
            f"sqlite:///{tmp_path}/ok.db",
            "--trials-dir",
            str(trials),
            cwd=tmp_path,
            timeout=120,
        )
        assert f"--trials-dir {trials}: cannot write there" in _one_error_line(other)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(trials)], check=False)
    assert (
        not list(tmp_path.glob("ok.db"))
        or optuna.get_all_study_names(f"sqlite:///{tmp_path}/ok.db") == []
    )


def test_locked_database_is_one_clear_error_and_keeps_the_trials(copy_of_measured: Path) -> None:
    import sqlite3

    workdir = copy_of_measured
    before = len(load(workdir).get_trials())
    holder = sqlite3.connect(workdir / "trials" / "autotune.db", isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # another process writing, and not letting go
        result = run_cli(
            "run",
            "--study",
            "gpt-tiny",
            "--executor",
            "local",
            cwd=workdir,
            env={"AUTOTUNE_SQLITE_BUSY_TIMEOUT_S": "2"},
            timeout=120,
        )
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    line = _one_error_line(result)
    assert "database is locked" in line and "continue with autotune run --study gpt-tiny" in line
    assert len(load(workdir).get_trials()) == before
    assert_no_probe_left()
