"""The newer model families through the CLI, as a user runs them: `autotune plan` for
DiT-XL/2 on one 48 GiB GPU and for a local Hugging Face config, and a CPU-sized DiT study of
real DeepSpeed probes that ends with an export."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.cli_study import exported_config

pytestmark = pytest.mark.slow


def test_plan_dit_xl_2_on_one_48_gib_gpu(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run_cli(
        "plan",
        "--workload",
        "dit-xl-2",
        "--gpus",
        "1",
        "--vram",
        "48GiB",
        cwd=tmp_path,
        env={"COLUMNS": "250"},
    )
    wall_s = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "dit-xl-2 (DiT, 28 layers, hidden 1152, patch 2, 256 tokens" in out
    assert "0.75B parameters" in out
    fitting = [line for line in out.splitlines() if line.startswith("│ yes")]
    assert fitting, out[:3000]
    # how long planning takes is a benchmark's number
    # (benchmarks/memory_accuracy/plan_tables.py), not a test's: the plan says it, and this
    # test prints it
    planned = re.search(r"planned in (\d+) s", out)
    assert planned, out[:1000]
    print(f"plan dit-xl-2: {planned.group(1)} s planned, {wall_s:.0f} s with the CLI's start")


def test_a_cpu_sized_dit_study_ends_with_an_export(tmp_path: Path) -> None:
    result = run_cli(
        "run",
        "--workload",
        "dit-tiny",
        "--gpus",
        "2",
        "--executor",
        "local",
        "--budget",
        "4m",
        "--max-trials",
        "2",
        "--no-confirm",  # a round of DiT re-probes: the confirmation has tests of its own
        "--warmup-steps",
        "1",
        "--timed-steps",
        "2",
        "--max-timed-steps",
        "4",
        "--seed",
        "0",
        cwd=tmp_path,
        env={"COLUMNS": "250"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "exported:" in result.stdout
    best = tmp_path / "trials" / "dit-tiny" / "best"
    _, config = exported_config(best)  # DeepSpeed's or FSDP2's, the default space has both
    assert config["train_batch_size"] == 16  # dit-tiny's default global batch
    assert (best / "summary.md").is_file()


def test_plan_a_local_hf_config(tmp_path: Path) -> None:
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "num_hidden_layers": 4,
                "vocab_size": 1000,
                "max_position_embeddings": 512,
            }
        )
    )
    result = run_cli(
        "plan",
        "--workload",
        "hf:my-llama?seq=256&batch=8",
        "--gpus",
        "2",
        "--vram",
        "16GiB",
        cwd=tmp_path,
        env={"COLUMNS": "250", "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "my-llama-batch8-seq256 (llama, 4 layers, seq 256)" in result.stdout
    assert "global batch 8" in result.stdout
    remote = tmp_path / "remote.json"
    remote.write_text(json.dumps({"model_type": "llama", "auto_map": {"AutoModel": "x.Y"}}))
    refused = run_cli(
        "plan", "--workload", f"hf:{remote}", "--gpus", "1", "--vram", "16GiB", cwd=tmp_path
    )
    assert refused.returncode == 2
    assert "needs remote code" in refused.stderr and len(refused.stderr.splitlines()) == 1
