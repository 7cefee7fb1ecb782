"""`autotune plan` without a GPU, and a study whose limit rules candidates out unprobed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest

from tests.support.cli import run_cli

pytestmark = pytest.mark.slow


def test_plan_llama_70b_on_this_cpu_machine(tmp_path: Path) -> None:
    # files, not pipes: the table outgrows a pipe's buffer, which nobody reads until the
    # process ends
    out_file, err_file = (tmp_path / "plan.out").open("w"), (tmp_path / "plan.err").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "plan",
            "--workload",
            "llama-70b",
            "--gpus",
            "4",
            "--vram",
            "80GiB",
            "--host-ram",
            "2TiB",
            "--all",
        ],
        cwd=tmp_path,
        # pytest leaves COLUMNS=80 in its children's environment; the rows must not wrap
        env={**os.environ, "COLUMNS": "250"},
        stdout=out_file,
        stderr=err_file,
        text=True,
    )
    peak_rss, started = 0, time.monotonic()
    watched = psutil.Process(process.pid)
    while process.poll() is None:
        try:
            peak_rss = max(peak_rss, watched.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.2)
    wall_s = time.monotonic() - started
    process.wait()
    out_file.close()
    err_file.close()
    out, err = (tmp_path / "plan.out").read_text(), (tmp_path / "plan.err").read_text()
    assert process.returncode == 0, err
    assert "68.98B parameters" in out and "of 588 valid candidates fit" in out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert len(rows) >= 588
    fitting = [r for r in rows if r.startswith("│ yes")]
    assert fitting, out[:3000]
    # 70B on 4x80 GiB needs ZeRO-3 and offload: 16 bytes of model states per parameter
    # sharded 4 ways is 276 GB per rank; with the optimizer on the host, 2+2 bytes remain.
    deepspeed = [r for r in fitting if "fsdp2" not in r]
    assert all("z3" in r and ("param:cpu" in r or "opt:cpu" in r) for r in deepspeed)
    assert any("param:cpu" in r for r in deepspeed)
    # FSDP2 as well, offloaded and reducing each micro-batch: unsharded gradients
    # accumulated between micro-batches would take 4 bytes per parameter on each GPU
    fsdp2 = [r for r in fitting if "fsdp2" in r]
    assert fsdp2 and all(" cpu" in r and "sync:each" in r for r in fsdp2)
    assert any("z1 bf16" in r and "no (device)" in r for r in rows)
    assert peak_rss < 4 * 2**30
    print(f"plan llama-70b: {wall_s:.0f} s, peak RSS {peak_rss / 2**30:.2f} GiB")


def test_tight_limit_prunes_without_probing(tmp_path: Path) -> None:
    # ZeRO 1-3 hold DeepSpeed's 5e8-element reduce bucket (0.9-1.9 GiB): over 600 MiB.
    # probes launched by the driver, not through Ray: the memory model is what this tests
    common = (
        "--workload", "gpt-tiny", "--gpus", "2", "--vram", "600MiB", "--budget", "8m",
        "--executor", "local",
    )  # fmt: skip
    fast = ("--max-trials", "1", "--no-confirm", "--warmup-steps", "2", "--timed-steps", "1")
    # autotune's sampler never proposes what the memory model rules out, and says so
    first = run_cli("run", *common, *fast, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "unevaluated candidate(s) predicted over the 600.00 MiB limit" in first.stdout
    assert "infeasible, not probed" not in first.stdout
    summary_md = (tmp_path / "trials" / "gpt-tiny" / "best" / "summary.md").read_text()
    assert "predicted over the limit by the memory model and never proposed" in summary_md
    # a sampler that knows nothing of memory proposes them; each is recorded, not probed
    # (seed 2 first proposes two ZeRO-3 candidates over the limit; gpt-tiny's FSDP2 all fit)
    second = run_cli("run", *common, *fast, "--sampler", "random", "--seed", "2", cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "infeasible, not probed: predicted peak" in second.stdout
    study = optuna.load_study(
        study_name="gpt-tiny", storage=f"sqlite:///{tmp_path}/trials/autotune.db"
    )
    trials = [t for t in study.get_trials() if "duplicate_of" not in t.user_attrs]
    pruned = [t for t in trials if t.user_attrs.get("pruned_by") == "memory-model"]
    probed = [t for t in trials if "probe_wall_s" in t.user_attrs]
    assert len(probed) == 2 and len(pruned) >= 1 and len(trials) > len(probed)
    for trial in pruned:
        assert trial.state == optuna.trial.TrialState.PRUNED
        assert trial.constraints["peak_over_limit_bytes"] > 0
        assert trial.user_attrs["predicted_peak_bytes"] > 600 * 2**20 * 0.95
        # never probed: no trial folder was made for it
        assert not (tmp_path / "trials" / "gpt-tiny" / f"trial-{trial.number:04d}").exists()
        assert "trial_dir" not in trial.user_attrs
    for trial in probed:
        # every probe stores its prediction next to what it measured
        assert trial.user_attrs["predicted_peak_bytes"] > 0 and trial.user_attrs["peak_bytes"] > 0
    best_label = (tmp_path / "trials" / "gpt-tiny" / "best" / "summary.md").read_text()
    assert "infeasible, not probed: memory-model" in best_label
    exported = {t.user_attrs["label"] for t in pruned}
    assert not any(f"# autotune: {label}\n" in best_label for label in exported)
