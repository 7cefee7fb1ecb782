"""Export: trial choice, backend_config over the base config, launch.sh, summary.md.

The study here is built from trial records (optuna.trial.create_trial) rather than probes,
so that every kind of outcome is present; the end-to-end test exports a real study.
"""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.candidate import Candidate
from autotune.errors import ExportError
from autotune.export._exporter import choose_trial, export
from autotune.study.storage import StudyConfig
from tests.support.studies import measured_trial, one_trial_study

BASE = {
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
    "gradient_clipping": 1.0,
}


def _candidate(stage: int, mb: int, **kwargs) -> Candidate:
    return Candidate(
        precision="bf16",
        zero_stage=stage,
        micro_batch_size=mb,
        gradient_accumulation_steps=8 // mb,
        data_parallel_size=2,
        **kwargs,
    )


@pytest.fixture
def study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", study_name="unit")
    config = StudyConfig(
        workload="gpt-tiny",
        space={},
        accelerator="cuda",
        gpus_per_trial=2,
        global_batch=16,
        vram_limit_bytes=8 * 2**30,
        base_config=BASE,
        threads_per_rank=4,
    )
    study.set_user_attr("autotune_config", config.model_dump(mode="json"))
    best = _candidate(3, 4, offload_optimizer="cpu", activation_checkpointing=True)
    trials = [
        measured_trial(_candidate(0, 1), "ok", 10.0),
        measured_trial(best, "ok", 42.0),
        measured_trial(_candidate(1, 2), "ok", 40.0),
        measured_trial(_candidate(2, 8), "oom"),
        measured_trial(_candidate(2, 4), "ok", 50.0, feasible=False),  # measured above the limit
        measured_trial(_candidate(1, 4), "error"),
        measured_trial(_candidate(1, 8), "timeout"),
        measured_trial(_candidate(0, 8), "pruned", pruned_by="memory-model"),
        measured_trial(_candidate(3, 8), "ok", 45.0, stopped_early=True),  # partial: never exported
    ]
    for trial in trials:
        study.add_trial(trial)
    return study


def test_best_feasible_is_exported_with_the_base_config(study, tmp_path: Path) -> None:
    exported = export(study, tmp_path)
    assert exported.trial == 1  # 50 samples/s was over the limit
    config = json.loads((tmp_path / "ds_config.json").read_text())
    assert config["scheduler"] == BASE["scheduler"] and config["gradient_clipping"] == 1.0
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert config["train_batch_size"] == 16 and config["bf16"]["enabled"] is True
    launch = (tmp_path / "launch.sh").read_text()
    assert (tmp_path / "launch.sh").stat().st_mode & 0o111
    assert (
        "deepspeed --num_gpus=2" in launch and "torchrun --standalone --nproc-per-node=2" in launch
    )
    assert 'OMP_NUM_THREADS="${OMP_NUM_THREADS:-4}"' in launch and "DS_ACCELERATOR" not in launch


def test_summary_explains_the_choice(study, tmp_path: Path) -> None:
    summary = (export(study, tmp_path), (tmp_path / "summary.md").read_text())[1]
    assert "# autotune: z3 bf16 mb4x2 opt:cpu ckpt" in summary
    assert "Fastest of 3 feasible configurations measured: 42.0 samples/s" in summary
    assert "(steps ranged 39.9-44.1)" in summary and "2688 tokens/s" in summary
    assert "1.00 GiB, 1.00 GiB of 8.00 GiB allowed" in summary
    # a record from before the peak was measured says what its number is
    assert (
        "Host memory per rank process, resident memory at the probe's end: 3.00 GiB, 3.00 GiB."
        in summary
    )
    runners = summary.split("## Runners-up")[1].split("## Search")[0]
    assert "| 2 | z1 bf16 mb2x4 | 40.0 | one probe | 95% |" in runners and "| 0 |" in runners
    # the chosen trial is never its own runner-up; a partial measurement is never ranked
    assert "| 1 |" not in runners and "| 8 |" not in runners
    assert "9 candidates evaluated:" in summary
    assert "feasible, measured in full: 3" in summary
    assert "feasible, stopped early as clearly slower than the best so far: 1" in summary
    assert "infeasible: ran out of memory in the probe: 1" in summary
    assert "infeasible: measured peak above the limit: 1" in summary
    assert "infeasible, not probed: memory-model: 1" in summary
    assert "failed: error: 1" in summary and "failed: timeout: 1" in summary
    assert "gradient_checkpointing_enable" in summary
    assert "leave that much free" in summary


def test_choose_a_trial(study) -> None:
    assert choose_trial(study, 2)[0].number == 2
    with pytest.raises(ExportError, match=r"--trial 3 cannot be exported: its status is 'oom'"):
        choose_trial(study, 3)
    with pytest.raises(ExportError, match="--trial 4 cannot be exported: its peak memory exceeded"):
        choose_trial(study, 4)
    with pytest.raises(ExportError, match="--trial 8 cannot be exported: its probe was stopped"):
        choose_trial(study, 8)
    with pytest.raises(ExportError, match=r"--trial 99: study 'unit' has trials 0-8"):
        choose_trial(study, 99)


def test_a_chosen_trial_says_which_is_the_best(study, tmp_path: Path) -> None:
    export(study, tmp_path, trial_number=2)
    summary = (tmp_path / "summary.md").read_text()
    assert "Chosen with --trial 2; the best is trial 1 (z3 bf16 mb4x2 opt:cpu ckpt)" in summary
    runners = summary.split("## Runners-up")[1].split("## Search")[0]
    assert "| 1 | z3 bf16 mb4x2 opt:cpu ckpt |" in runners and "| 2 |" not in runners


def test_host_memory_in_the_words_of_its_measurement_and_over_host_ram(
    study, tmp_path: Path
) -> None:
    measured = {
        "host_peak_method": "kernel_hwm",
        "node_per_rank": ["gpu-node-7", "gpu-node-7"],
        "host_ram_bytes": 8 * 2**30,
    }
    best = _candidate(2, 2, offload_optimizer="cpu")
    over = _candidate(2, 1, offload_optimizer="cpu")
    host_error = "measured host memory 10.00 GiB on node gpu-node-7 (2 rank(s)) is over ..."
    study.add_trial(measured_trial(best, "ok", 60.0, **measured))
    study.add_trial(
        measured_trial(
            over,
            "ok",
            70.0,
            feasible=False,
            error=host_error,
            **{**measured, "host_peak_bytes_per_rank": [5 * 2**30, 5 * 2**30]},
        )
    )
    export(study, tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert "# autotune: z2 bf16 mb2x4 opt:cpu" in summary
    assert (
        "- Host memory per rank process, peak resident memory (kernel high-water mark): "
        "3.00 GiB, 3.00 GiB; summed per node 6.00 GiB on gpu-node-7, of --host-ram 8.00 GiB."
    ) in summary
    assert "reached 3.00 GiB, 3.00 GiB per rank (peak resident memory (kernel high-water" in summary
    assert "infeasible: measured host memory above --host-ram: 1" in summary
    assert "infeasible: measured peak above the limit: 1" in summary  # trial 4, the device's
    with pytest.raises(ExportError, match=r"--trial 10 cannot be exported: measured host memory"):
        choose_trial(study, 10)


def test_launch_script_quotes_what_comes_from_the_storage(tmp_path: Path) -> None:
    """A study name is text from a (possibly shared) database: a newline in it must not end
    the comment it is quoted in and run as a command."""
    import subprocess

    study = optuna.create_study(direction="maximize", study_name="x\ntouch INJECTED #")
    config = StudyConfig(
        workload="gpt-tiny",
        space={},
        accelerator="cpu",
        gpus_per_trial=2,
        global_batch=16,
        vram_limit_bytes=8 * 2**30,
    )
    study.set_user_attr("autotune_config", config.model_dump(mode="json"))
    study.add_trial(measured_trial(_candidate(0, 4), "ok", 10.0, label="a\ntouch INJECTED2 #"))
    export(study, tmp_path / "out", trial_number=0)
    launch = tmp_path / "out" / "launch.sh"
    result = subprocess.run(
        ["bash", str(launch)], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert "usage:" in result.stderr  # it stopped at the missing script argument
    assert not (tmp_path / "INJECTED").exists() and not (tmp_path / "INJECTED2").exists()


def test_nothing_feasible() -> None:
    study = optuna.create_study(direction="maximize", study_name="empty")
    with pytest.raises(ExportError, match="has no feasible measured trial yet"):
        choose_trial(study, None)


def test_unwritable_output(study, tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(ExportError, match="cannot write to"):
        export(study, blocked / "sub")


@pytest.mark.parametrize("precision", ["high", "highest"])
def test_launch_sh_gives_production_the_probes_matmul_precision(
    tmp_path: Path, precision: str
) -> None:
    """With --tf32 the probes timed fp32 matmuls on TF32: the exported launch.sh makes the
    production script's cuBLAS matmuls use TF32 too (read back from torch in the launched
    process), and summary.md says so; without it production stays IEEE fp32."""
    import subprocess
    import sys

    study = optuna.create_study(direction="maximize", study_name="tf32")
    config = StudyConfig(
        workload="gpt-tiny",
        space={},
        accelerator="cuda",
        gpus_per_trial=1,
        global_batch=16,
        vram_limit_bytes=8 * 2**30,
        float32_matmul_precision=precision,
    )
    study.set_user_attr("autotune_config", config.model_dump(mode="json"))
    study.add_trial(measured_trial(_candidate(0, 4), "ok", 10.0))
    export(study, tmp_path / "out")
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        "open(sys.argv[0] + '.out', 'w').write(str(torch.backends.cuda.matmul.allow_tf32))\n"
    )
    bin_dir = str(Path(sys.executable).parent)
    result = subprocess.run(
        ["bash", str(tmp_path / "out" / "launch.sh"), str(script)],
        cwd=tmp_path,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "LAUNCHER": "torchrun"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    tf32 = precision == "high"
    assert (tmp_path / "train.py.out").read_text() == str(tf32)
    summary = (tmp_path / "out" / "summary.md").read_text()
    if tf32:
        assert "launch.sh exports `TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1`" in summary
    else:
        assert "do not turn TF32 on" in summary


def test_an_fsdp2_winner_says_what_the_script_does_itself(study, tmp_path: Path) -> None:
    from autotune.candidate import FsdpKnobs

    fsdp2 = Candidate(
        backend="fsdp2", precision="bf16", zero_stage=3, micro_batch_size=2,
        gradient_accumulation_steps=4, data_parallel_size=2,
        fsdp=FsdpKnobs(sync_each_micro_batch=True),
    )  # fmt: skip
    study.add_trial(measured_trial(fsdp2, "ok", 60.0))
    exported = export(study, tmp_path)
    assert exported.trial == 9
    config = json.loads((tmp_path / "fsdp2_config.json").read_text())
    assert config["sync_each_micro_batch"] is True and config["gradient_clipping"] == 1.0
    summary = (tmp_path / "summary.md").read_text()
    assert "| gradients reduced | after each micro-batch" in summary
    assert "GradientAccumulationPlugin(num_steps=4, sync_each_batch=True)" in summary
    # the base config's scheduler is DeepSpeed's: FSDP2's config does not carry it
    assert "not its DeepSpeed-only keys (`scheduler`): set those in your script" in summary


def _exported_summary(tmp_path: Path, workload: str, best: Candidate) -> str:
    """summary.md of a study on ``workload`` whose one trial, ``best``, measured."""
    export(one_trial_study(workload, best), tmp_path)
    return (tmp_path / "summary.md").read_text()


def test_a_share_of_the_blocks_recomputed_says_which_blocks_to_wrap(tmp_path: Path) -> None:
    """The export counts the share in the study's workload's blocks and gives the lines of
    each way to recompute them (transformers' per-layer switch, or a block's forward)."""
    summary = _exported_summary(tmp_path, "gpt2", _candidate(2, 4, checkpoint_fraction=0.25))
    assert "# autotune: z2 bf16 mb4x2 ckpt:0.25" in summary
    assert "| activation checkpointing | first 0.25 of the blocks |" in summary
    assert "the first 3 of the model's 12 transformer blocks" in summary
    assert "`layer.gradient_checkpointing = False` on `layers[3:]`" in summary
    assert "checkpoint_leading_blocks" in summary


def test_a_selective_winner_says_how_to_recompute_selectively(tmp_path: Path) -> None:
    best = _candidate(2, 4, checkpoint_fraction=1.0, checkpoint_policy="selective")
    summary = _exported_summary(tmp_path, "gpt-tiny", best)
    assert "| activation checkpointing | on, selective |" in summary
    assert "context_fn=autotune.workloads.checkpointing.selective_context()" in summary


def test_an_offloading_winner_says_how_to_keep_its_activations_on_the_host(
    tmp_path: Path,
) -> None:
    best = _candidate(2, 4, checkpoint_fraction=0.25, activation_offload="cpu")
    summary = _exported_summary(tmp_path, "gpt2", best)
    assert "# autotune: z2 bf16 mb4x2 ckpt:0.25 act:cpu" in summary
    assert (
        "| activation checkpointing | first 0.25 of the blocks; other blocks' activations on "
        "the host |"
    ) in summary
    assert "the last 9 of the model's 12 transformer blocks in host memory" in summary
    assert "autotune.workloads.activation_offload.offload_saved_tensors()" in summary
    assert "`torch.autograd.graph.save_on_cpu(pin_memory=True)`" in summary
    assert "moves parameters too" in summary
    kept = _exported_summary(tmp_path / "kept", "gpt2", _candidate(2, 4, checkpoint_fraction=0.25))
    assert "activation_offload" not in kept and "host memory, as the probes did" not in kept
