"""An export's recomputation lines run: a script that follows summary.md's lines for a
built-in workload (a transformers model's per-layer switch; a DiT's blocks wrapped, with
the selective policy) trains under the exported launch.sh and ds_config.json on 2 CPU ranks,
recomputing the blocks the export names."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.candidate import Candidate
from autotune.export._exporter import export
from tests.support.paths import ASSETS
from tests.support.studies import one_trial_study

pytestmark = pytest.mark.slow


def _winner(fraction: float, policy: str = "full") -> Candidate:
    """fp32 ZeRO-0 at mb4x2 on 2 ranks, recomputing ``fraction`` of its blocks."""
    return Candidate(
        precision="fp32",
        zero_stage=0,
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        data_parallel_size=2,
        checkpoint_fraction=fraction,
        checkpoint_policy=policy,
    )


@pytest.mark.parametrize(("workload", "policy"), [("gpt-tiny", "full"), ("dit-tiny", "selective")])
def test_the_exported_lines_recompute_the_named_blocks_under_launch_sh(
    tmp_path: Path, workload: str, policy: str
) -> None:
    best = _winner(0.5, policy)
    out = tmp_path / "export"
    export(one_trial_study(workload, best, accelerator="cpu", threads_per_rank=1), out)
    summary = (out / "summary.md").read_text()
    named = re.search(r"the first (\d+) of the model's (\d+)", summary)
    assert named is not None, summary
    first, blocks = int(named[1]), int(named[2])
    assert (first, blocks) == (1, 2)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "LAUNCHER": "torchrun",
        "MASTER_PORT": str(port),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    train = subprocess.run(
        [
            str(out / "launch.sh"),
            str(ASSETS / "train_with_recomputation.py"),
            "--workload",
            workload,
            "--recompute-first",
            str(first),
            "--policy",
            policy,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert f"TRAINED global_steps=2 recomputing={first}/{blocks}" in train.stdout + train.stderr


def test_a_scripts_share_reaches_it_through_launch_sh(tmp_path: Path) -> None:
    """A script that takes the share as a flag (``--script-arg
    checkpoint_fraction=--ckpt-share``) gets the winner's share from the exported
    launch.sh, beside the exported config, on 2 CPU ranks."""
    from autotune.script_config import ScriptConfig

    script = tmp_path / "train.py"
    script.write_text(
        "import argparse, json, os\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--deepspeed_config')\n"
        "parser.add_argument('--ckpt-share', type=float, default=0.0)\n"
        "args = parser.parse_args()\n"
        "config = json.load(open(args.deepspeed_config))\n"
        "if os.environ.get('RANK') == '0':\n"
        "    print(f'SHARE {args.ckpt_share} MB {config[\"train_micro_batch_size_per_gpu\"]}')\n"
    )
    best = _winner(0.25)
    config = ScriptConfig(
        path=str(script),
        args=["--deepspeed_config", "ds_config.json", "--ckpt-share", "0"],
        kind="deepspeed",
        flags={"checkpoint_fraction": "--ckpt-share"},
        config_flag="--deepspeed_config",
        config_path=str(tmp_path / "ds_config.json"),
        cwd=str(tmp_path),
    )
    out = tmp_path / "export"
    study = one_trial_study(
        f"script:{script.name}", best, accelerator="cpu", threads_per_rank=1, script=config
    )
    export(study, out)
    assert "`--ckpt-share` 0 -> 0.25" in (out / "summary.md").read_text()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    ran = subprocess.run(
        [str(out / "launch.sh")], capture_output=True, text=True, env=env, timeout=120
    )
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert "SHARE 0.25 MB 4" in ran.stdout + ran.stderr
