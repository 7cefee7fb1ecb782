"""The FSDP2 backend's pure parts: a candidate as its config and the check of an exported
one, its memory terms, accelerate's config file as accelerate itself reads it, and the
summary's ``fully_shard`` lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune.backends import ActivationProfile, Breakdown, ModelFacts, get_backend
from autotune.candidate import Candidate, FsdpKnobs
from autotune.errors import ExportError

FSDP2 = get_backend("fsdp2")
FACTS = ModelFacts(
    params=1_000_000, largest_param=200_000, small_params=0, block_params=800_000,
    largest_block_params=200_000,
)  # fmt: skip
NO_ACTIVATIONS = ActivationProfile(
    forward_peak_bytes=0, backward_peak_bytes=0, at_first_grad_bytes=0,
    in_blocks_backward_peak_bytes=0, after_blocks_backward_peak_bytes=0,
)  # fmt: skip


def _fsdp2(**fields: object) -> Candidate:
    values = {
        "backend": "fsdp2", "precision": "bf16", "zero_stage": 3, "micro_batch_size": 4,
        "gradient_accumulation_steps": 1, "data_parallel_size": 2, **fields,
    }  # fmt: skip
    return Candidate.model_validate(values)


def test_a_candidate_renders_its_fully_shard_settings_and_the_base_optimizer() -> None:
    candidate = _fsdp2(
        gradient_accumulation_steps=2, offload_optimizer="cpu", offload_param="cpu",
        fsdp=FsdpKnobs(reshard_after_forward=False, reduce_dtype="bf16"),
    )  # fmt: skip
    base = {"optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95]}}}
    config = FSDP2.render_config(candidate, base)
    assert config["fully_shard"] == {
        "reshard_after_forward": False, "param_dtype": "bf16", "reduce_dtype": "bf16",
        "cpu_offload": True, "wrap": "block",
    }  # fmt: skip
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]) == (
        4,
        2,
    )
    assert config["train_batch_size"] == 16
    assert config["optimizer"] == base["optimizer"]
    FSDP2.validate_config(config, 2)
    with pytest.raises(ExportError, match="not micro-batch x accumulation x 4 ranks"):
        FSDP2.validate_config(config, 4)
    with pytest.raises(ExportError, match=r"optimizer type 'Lamb' has no torch\.optim class"):
        FSDP2.validate_config({**config, "optimizer": {"type": "Lamb"}}, 2)
    with pytest.raises(ExportError, match=r"fully_shard\.wrap"):
        FSDP2.validate_config({**config, "fully_shard": {**config["fully_shard"], "wrap": "x"}}, 2)


def test_fp32_reduces_in_fp32_whatever_the_knob_says() -> None:
    candidate = _fsdp2(precision="fp32", fsdp=FsdpKnobs(reduce_dtype="bf16"))
    assert FSDP2.render_config(candidate)["fully_shard"]["reduce_dtype"] == "fp32"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"zero_stage": 2}, "zero_stage 3"),
        ({"offload_optimizer": "cpu"}, "both none or both cpu"),
        ({"offload_optimizer": "nvme", "offload_param": "nvme"}, "both none or both cpu"),
    ],
)
def test_an_fsdp2_candidate_states_fsdp2_sharding(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _fsdp2(**fields)


def test_deepspeed_candidates_keep_their_key_and_take_no_fsdp_knobs() -> None:
    deepspeed = Candidate(
        precision="bf16", zero_stage=1, micro_batch_size=4, gradient_accumulation_steps=1,
        data_parallel_size=2,
    )  # fmt: skip
    assert '"backend"' not in deepspeed.key and '"fsdp"' not in deepspeed.key
    assert '"backend": "fsdp2"' in _fsdp2().key
    assert _fsdp2().fsdp == FsdpKnobs()  # the defaults, filled in
    with pytest.raises(ValueError, match="fsdp knobs apply to backend fsdp2 only"):
        Candidate.model_validate({**deepspeed.model_dump(), "fsdp": {}})
    assert _fsdp2(fsdp=FsdpKnobs(reshard_after_forward=False)).label == (
        "fsdp2 bf16 mb4x1 reshard:no"
    )


def _phases(
    candidate: Candidate, act: ActivationProfile = NO_ACTIVATIONS
) -> tuple[dict[str, Breakdown], Breakdown]:
    return FSDP2.transient_phases(candidate, FACTS, act, {}, Breakdown())


def test_memory_terms_follow_the_sharding() -> None:
    shard = FACTS.params / 2
    device, host = FSDP2.model_states(_fsdp2(), FACTS)
    assert (device.params, device.optimizer_states, device.grads) == (4 * shard, 8 * shard, 0)
    assert host.total == 0
    device, host = FSDP2.model_states(_fsdp2(offload_optimizer="cpu", offload_param="cpu"), FACTS)
    assert device.total == 0 and host.total == 12 * shard
    resharded = _phases(_fsdp2())[0]
    kept = _phases(_fsdp2(fsdp=FsdpKnobs(reshard_after_forward=False)))[0]
    whole = _phases(_fsdp2(fsdp=FsdpKnobs(wrap="model")))[0]
    # bf16 gathered: at the end of forward the root (200k), or every block kept too; the
    # last unit's flat all-gather output (a 200k block, or the whole model as one unit)
    assert resharded["forward"].params == 2 * 200_000
    assert kept["forward"].params == whole["forward"].params == 2 * FACTS.params
    assert resharded["forward"].buckets == kept["forward"].buckets == 2 * 200_000
    assert whole["forward"].buckets == 2 * FACTS.params
    # in a block's backward the next block is gathered ahead only where blocks reshard;
    # blocks kept gathered stay so, but the running one is resharded before its gradients
    # are copied into the reduce-scatter input (the larger of its two moments under bf16)
    assert resharded["backward"].params == 2 * (200_000 + 200_000)
    assert kept["backward"].params == 2 * (FACTS.params - 200_000)
    assert kept["backward"].grads == resharded["backward"].grads
    # in fp32 the two moments weigh the same: the running block gathered with its
    # gradients, or its gradients beside the reduce-scatter input
    fp32_kept = _phases(_fsdp2(precision="fp32", fsdp=FsdpKnobs(reshard_after_forward=False)))
    assert fp32_kept[0]["backward"].total == 4 * FACTS.params + 4 * 200_000
    # a unit's bf16 gradients, their fp32 cast and the fp32 reduce-scatter input: a block's
    # in its backward, the root's (or the whole model's) at the end, with the fp32 shards
    assert resharded["backward"].grads == (2 + 4 + 4) * 200_000
    assert resharded["backward end"].grads == (2 + 4 + 4) * 200_000 + 4 * FACTS.params / 2
    assert whole["backward end"].grads == (2 + 4 + 4) * FACTS.params + 4 * FACTS.params / 2
    single = resharded["backward"].grads
    accumulating = _phases(_fsdp2(gradient_accumulation_steps=2))[0]["backward"].grads
    # every unreduced gradient kept in fp32 (the reduce dtype); the block's is copied from
    # it, not cast again
    assert accumulating - single == 4 * FACTS.params - 4 * 200_000


def test_the_roots_backward_holds_every_blocks_gradient_shards() -> None:
    """After the blocks' backward, before the root's deferred post-backward: the root
    gathered (bf16, 200k), every block's fp32 shards (800k over 2 ranks), the last block's
    fp32 reduce-scatter input (the largest block, 200k) and what backward holds from there."""
    after = ActivationProfile(
        forward_peak_bytes=0, backward_peak_bytes=5_000_000, at_first_grad_bytes=0,
        in_blocks_backward_peak_bytes=5_000_000, after_blocks_backward_peak_bytes=3_000_000,
    )  # fmt: skip
    phases = _phases(_fsdp2(), after)[0]
    root = phases["root backward"]
    assert (root.params, root.grads) == (2 * 200_000, 4 * 800_000 / 2 + 4 * 200_000)
    assert root.activations == 3_000_000
    assert root.total == 5_800_000
    kept = _phases(_fsdp2(fsdp=FsdpKnobs(reshard_after_forward=False)), after)[0]
    assert kept["root backward"] == root  # every block resharded by its post-backward
    assert "root backward" not in _phases(_fsdp2(fsdp=FsdpKnobs(wrap="model")), after)[0]
    # accumulated unreduced: the root's earlier gradients (fp32, the reduce dtype) remain;
    # reduced after each: every shard, this micro-batch's added into them
    unreduced = _phases(_fsdp2(gradient_accumulation_steps=2), after)[0]["root backward"]
    assert unreduced.grads - root.grads == 4 * 200_000
    each = _fsdp2(gradient_accumulation_steps=2, fsdp=FsdpKnobs(sync_each_micro_batch=True))
    synced = _phases(each, after)[0]["root backward"]
    assert synced.grads - root.grads == 4 * 200_000 / 2
    # offloaded, the shards are on the host by then; the input stays on the device
    offloaded = _fsdp2(offload_optimizer="cpu", offload_param="cpu")
    assert _phases(offloaded, after)[0]["root backward"].grads == 4 * 200_000
    steady = FSDP2.model_states(offloaded, FACTS)[1]
    host = FSDP2.host_phases(offloaded, FACTS, steady)["root backward"]
    assert host.total == steady.total + 4 * 800_000 / 2


def test_an_earlier_micro_batchs_root_backward_holds_every_unsharded_gradient() -> None:
    """Accumulated unreduced, a micro-batch before the last runs the root's backward beside
    every block's unsharded gradients (fp32, the reduce dtype, wider than bf16), the root
    gathered (bf16) and the activations after the blocks, with no reduce-scatter input;
    from the third micro-batch on the root's own earlier gradients too. Reduced after
    each, or with one micro-batch, there is no such moment."""
    after = ActivationProfile(
        forward_peak_bytes=0, backward_peak_bytes=5_000_000, at_first_grad_bytes=0,
        in_blocks_backward_peak_bytes=2_000_000, after_blocks_backward_peak_bytes=3_000_000,
    )  # fmt: skip
    name = "root backward, earlier micro-batch"
    two = _phases(_fsdp2(gradient_accumulation_steps=2), after)[0][name]
    assert (two.params, two.grads, two.activations) == (2 * 200_000, 4 * 800_000, 3_000_000)
    three = _phases(_fsdp2(gradient_accumulation_steps=3), after)[0][name]
    assert three.grads - two.grads == 4 * 200_000
    each = _fsdp2(gradient_accumulation_steps=2, fsdp=FsdpKnobs(sync_each_micro_batch=True))
    assert name not in _phases(each, after)[0]
    assert name not in _phases(_fsdp2(), after)[0]


def test_a_blocks_backward_holds_the_activations_until_the_blocks_are_done() -> None:
    """Per block, the block moment holds what backward holds until every block has its
    gradients, not the peak after them (the root's own backward, its own moment); as one
    unit the model is gathered through the whole backward, whose peak it holds."""
    act = ActivationProfile(
        forward_peak_bytes=0, backward_peak_bytes=5_000_000, at_first_grad_bytes=0,
        in_blocks_backward_peak_bytes=2_000_000, after_blocks_backward_peak_bytes=4_000_000,
    )  # fmt: skip
    for knobs in (FsdpKnobs(), FsdpKnobs(reshard_after_forward=False)):
        phases = _phases(_fsdp2(fsdp=knobs), act)[0]
        assert phases["backward"].activations == 2_000_000
        assert phases["backward"] == _phases(_fsdp2(fsdp=knobs))[0]["backward"].plus(
            Breakdown(activations=2_000_000)
        )
        assert phases["root backward"].activations == 4_000_000
    whole = _phases(_fsdp2(fsdp=FsdpKnobs(wrap="model")), act)[0]
    assert whole["backward"].activations == 5_000_000


def test_one_rank_gathers_into_no_flat_buffer() -> None:
    """At world size 1 torch (2.9 on, installed here) copies each shard straight into its
    unsharded parameter: no flat all-gather output beside the gathered unit, for one block
    or for the whole model as one unit."""
    from autotune.backends.fsdp2._memory import all_gathers

    for knobs in (FsdpKnobs(), FsdpKnobs(wrap="model")):
        one, two = _fsdp2(data_parallel_size=1, fsdp=knobs), _fsdp2(fsdp=knobs)
        alone, beside = _phases(one)[0]["forward"], _phases(two)[0]["forward"]
        assert alone.buckets == 0 and beside.buckets > 0
        assert alone.params == beside.params  # the gathered parameters themselves remain
        assert all_gathers(one, "2.8.1+cu128") and not all_gathers(one, "2.9.0")
        assert all_gathers(two, "2.13.0")


def test_reducing_each_micro_batch_keeps_only_the_gradient_shards() -> None:
    each = FsdpKnobs(sync_each_micro_batch=True)
    single = _phases(_fsdp2())[0]
    synced = _phases(_fsdp2(gradient_accumulation_steps=2, fsdp=each))[0]
    # the earlier micro-batches' fp32 gradient shards, beside what one micro-batch holds
    # (the block's gradients cast to the reduce dtype again: none are accumulated unsharded)
    for phase in ("forward", "backward"):
        assert synced[phase].grads - single[phase].grads == 4 * FACTS.params / 2
    assert synced["backward end"].grads == single["backward end"].grads
    offloaded = _fsdp2(
        gradient_accumulation_steps=2, fsdp=each, offload_optimizer="cpu", offload_param="cpu"
    )
    assert _phases(offloaded)[0]["forward"].grads == 0  # the shards accumulate on the host
    with pytest.raises(ValueError, match="with gradient accumulation only"):
        _fsdp2(fsdp=each)
    label = _fsdp2(gradient_accumulation_steps=2, fsdp=each).label
    assert label == "fsdp2 bf16 mb4x2 reshard:yes sync:each"
    code = "\n".join(
        FSDP2.code_lines(FSDP2.render_config(_fsdp2(gradient_accumulation_steps=2, fsdp=each)))
    )
    assert "set_requires_gradient_sync" not in code and "reduced after each" in code


def test_accelerate_reads_the_exported_config(tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    candidate = _fsdp2(fsdp=FsdpKnobs(reshard_after_forward=False))
    config = FSDP2.render_config(candidate)
    files = FSDP2.export_files(config, 2, "cuda", "GPT2Block")
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(files["accelerate_config.yaml"])
    loaded = load_config_from_file(str(path))
    assert loaded.distributed_type == "FSDP" and loaded.num_processes == 2
    assert loaded.mixed_precision == "bf16"
    assert loaded.fsdp_config["fsdp_version"] == 2
    assert loaded.fsdp_config["fsdp_reshard_after_forward"] is False
    assert loaded.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "GPT2Block"


def _launch(tmp_path: Path, text: str, launcher: str) -> subprocess.CompletedProcess[str]:
    """Run ``launch.sh`` with ``launcher``, whose command is a stand-in on PATH that prints
    its arguments and the accumulation accelerate would read (torchrun and accelerate
    launch start ranks on GPUs, which this machine has none of)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("torchrun", "accelerate"):
        stand_in = bin_dir / name
        stand_in.write_text(
            f'#!/bin/sh\necho "{name} $* steps=${{ACCELERATE_GRADIENT_ACCUMULATION_STEPS:-}}"\n'
        )
        stand_in.chmod(0o755)
    script = tmp_path / "launch.sh"
    script.write_text(text)
    script.chmod(0o755)
    return subprocess.run(
        [str(script), "train.py", "--lr", "1"],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "LAUNCHER": launcher},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_launch_sh_runs_the_fully_shard_code_by_default(tmp_path: Path) -> None:
    """torchrun with the script calling fully_shard (what the probes ran) on GPUs too;
    accelerate where asked, with the accumulation set where Accelerator() reads it, never
    through ``accelerate launch --gradient_accumulation_steps`` (its DeepSpeed path only)."""
    config = {**FSDP2.render_config(_fsdp2()), "gradient_accumulation_steps": 3}
    launch = FSDP2.launch_script("study 's'", 2, "cuda", 4, {}, config)
    assert "LAUNCHER:-torchrun" in launch and "--gradient_accumulation_steps" not in launch
    ran = _launch(tmp_path, launch, "")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("torchrun --standalone --nproc-per-node=2 train.py")
    assert "--fsdp2_config" in ran.stdout and ran.stdout.rstrip().endswith("--lr 1 steps=")
    ran = _launch(tmp_path, launch, "accelerate")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("accelerate launch --config_file ")
    assert ran.stdout.rstrip().endswith("train.py --lr 1 steps=3")


@pytest.mark.parametrize(
    ("knobs", "accelerator", "why"),
    [
        ({"reshard_after_forward": 2}, "cuda", "reshards to groups of 2 ranks"),
        ({}, "cpu", "accelerate does not shard on CPU ranks"),
    ],
)
def test_launch_sh_refuses_accelerate_where_it_runs_other_than_measured(
    tmp_path: Path, knobs: dict, accelerator: str, why: str
) -> None:
    config = FSDP2.render_config(_fsdp2(data_parallel_size=4, fsdp=FsdpKnobs(**knobs)))
    launch = FSDP2.launch_script("study 's'", 4, accelerator, 4, {}, config)
    ran = _launch(tmp_path, launch, "accelerate")
    assert ran.returncode == 2 and ran.stdout == ""
    (line,) = ran.stderr.splitlines()
    assert line.startswith("accelerate cannot run this config: ") and why in line
    assert line.endswith("use LAUNCHER=torchrun")
    assert _launch(tmp_path, launch, "torchrun").returncode == 0


def test_an_integer_reshard_writes_no_accelerate_config_which_accelerate_refuses() -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin

    config = FSDP2.render_config(
        _fsdp2(data_parallel_size=4, fsdp=FsdpKnobs(reshard_after_forward=2))
    )
    assert FSDP2.export_files(config, 4, "cuda", "GPT2Block") == {}
    # the installed accelerate's FSDP2 plugin: a bool only
    with pytest.raises(ValueError, match="please set to a `bool`"):
        FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=2)


def test_the_summary_says_where_accelerate_differs_as_the_installed_accelerate_does() -> None:
    """The differences summary.md states, checked against the installed accelerate: its
    FSDP2 plugin reduces in the parameter dtype, and Accelerator() takes its accumulation
    from the variable launch.sh exports."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    text = "\n".join(FSDP2.config_usage_lines(2, None))
    assert "reduces gradients in the parameter dtype" in text and "autocast" in text
    assert "Checked against accelerate 1.16" in text
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True)
    plugin.set_mixed_precision("bf16")
    assert plugin.mixed_precision_policy.reduce_dtype == torch.bfloat16
    read = subprocess.run(
        [sys.executable, "-c", "import accelerate; print(accelerate.Accelerator(cpu=True)"
         ".gradient_accumulation_steps)"],
        env={**os.environ, "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "3"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr
    assert read.stdout.split()[-1] == "3"


def test_code_lines_show_the_fully_shard_calls() -> None:
    candidate = _fsdp2(activation_checkpointing=True, offload_optimizer="cpu", offload_param="cpu")
    code = "\n".join(FSDP2.code_lines(FSDP2.render_config(candidate)))
    assert "reshard_after_forward=True" in code
    assert "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)" in code
    assert "offload_policy=CPUOffloadPolicy(pin_memory=torch.cuda.is_available())" in code
    assert "fully_shard(block, **policy)" in code and "gradient_checkpointing_enable" in code
    compile(code.replace("torch.optim", "optim"), "<summary>", "exec")  # valid Python


def test_a_script_is_never_handed_fsdp2() -> None:
    from autotune.errors import AutotuneError
    from autotune.script_config import ScriptConfig

    script = ScriptConfig(path="/work/train.py", kind="deepspeed", cwd="/work")
    with pytest.raises(AutotuneError, match="FSDP2 probes of a script are not supported"):
        FSDP2.config_for_script({}, script)
    with pytest.raises(AutotuneError, match="drop fsdp2 from the space's backend"):
        FSDP2.script_launch_script(origin="train.py")


def test_offloaded_gradient_shards_reach_the_host_after_the_devices_peak() -> None:
    shard = FACTS.params / 2
    assert FSDP2.host_phases(_fsdp2(), FACTS, Breakdown()) == {}  # nothing on the host
    offloaded = _fsdp2(offload_optimizer="cpu", offload_param="cpu")
    steady = FSDP2.model_states(offloaded, FACTS)[1]
    _, host_peak = FSDP2.transient_phases(offloaded, FACTS, NO_ACTIVATIONS, {}, steady)
    at = FSDP2.host_phases(offloaded, FACTS, steady)
    # the shards (4 bytes each) are all there at the end of backward only
    assert host_peak.total == steady.total + 4 * shard
    assert at["forward"].total == at["backward"].total == steady.total
    assert "backward end" not in at  # at the host's peak
    # reduced after each micro-batch, the earlier ones' shards are there from the start
    synced = _fsdp2(
        gradient_accumulation_steps=2, offload_optimizer="cpu", offload_param="cpu",
        fsdp=FsdpKnobs(sync_each_micro_batch=True),
    )  # fmt: skip
    assert FSDP2.host_phases(synced, FACTS, steady)["forward"].total == steady.total + 4 * shard


def test_a_cpu_rank_counts_device_and_host_together_phase_by_phase() -> None:
    from autotune.memory import MemoryModel
    from autotune.workloads import get_workload

    model = MemoryModel(get_workload("gpt-tiny"))
    offloaded = model.predict(_fsdp2(offload_optimizer="cpu", offload_param="cpu"))
    kept = model.predict(_fsdp2())
    # one RAM: what moved to the host is counted once, where the two peak together
    assert offloaded.tracked_bytes("cpu") < offloaded.device.total + offloaded.host.total
    assert offloaded.tracked_bytes("cpu") == kept.tracked_bytes("cpu")
    assert offloaded.tracked_bytes("cuda") < kept.tracked_bytes("cuda")


PRINTED_CODE_HARNESS = """
import os, socket, sys, torch
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

    def gradient_checkpointing_enable(self):
        pass

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


model = Model()
exec(sys.stdin.read())
model(torch.ones(2, 8)).float().sum().backward()
optimizer.step()
torch.distributed.destroy_process_group()
print("trained")
"""


@pytest.mark.parametrize("offload", ["none", "cpu"])
def test_the_printed_fully_shard_code_runs_on_cpu_ranks(offload: str) -> None:
    """summary.md's code, as a user pastes it, starts its process group and trains a step
    where it is run (here a CPU rank: gloo, not the CUDA pair)."""
    import subprocess
    import sys

    candidate = _fsdp2(
        activation_checkpointing=True, offload_optimizer=offload, offload_param=offload
    )
    code = "\n".join(FSDP2.code_lines(FSDP2.render_config(candidate)))
    ran = subprocess.run(
        [sys.executable, "-c", PRINTED_CODE_HARNESS],
        input=code,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0 and "trained" in ran.stdout, ran.stderr[-2000:]


def test_a_share_of_the_blocks_is_the_scripts_to_wrap_and_accelerate_recomputes_none() -> None:
    """accelerate recomputes every block or none: a share's config says so, and the code
    lines wrap the first blocks' forward, as the probes did."""
    candidate = _fsdp2(checkpoint_fraction=0.5)
    config = FSDP2.render_config(candidate)
    assert config["activation_checkpointing"] is True and config["checkpoint_fraction"] == 0.5
    assert "checkpoint_fraction" not in FSDP2.render_config(_fsdp2(activation_checkpointing=True))
    code = "\n".join(FSDP2.code_lines(config))
    assert "for block in blocks[: max(1, int(0.5 * len(blocks) + 0.5))]:" in code
    assert "gradient_checkpointing_enable" not in code
    compile(code.replace("torch.optim", "optim"), "<summary>", "exec")
    from autotune.backends.fsdp2._export_text import accelerate_config

    text = accelerate_config(config, 2, "cuda", "GPT2Block")
    assert "fsdp_activation_checkpointing: false" in text


def test_a_selective_policy_reaches_the_code_lines() -> None:
    config = FSDP2.render_config(_fsdp2(checkpoint_fraction=1.0, checkpoint_policy="selective"))
    assert config["checkpoint_policy"] == "selective" and "checkpoint_fraction" not in config
    code = "\n".join(FSDP2.code_lines(config))
    assert "context_fn=autotune.workloads.checkpointing.selective_context()" in code
    compile(code.replace("torch.optim", "optim"), "<summary>", "exec")


def test_an_activation_offload_reaches_the_config_and_the_code_lines() -> None:
    """The field is written only where the candidate offloads (configs of candidates that
    keep their activations on the device read as before), and the code wraps the blocks
    after the recomputed ones, or every block where none is recomputed."""
    assert "activation_offload" not in FSDP2.render_config(_fsdp2(checkpoint_fraction=0.5))
    for fraction, kept in (
        (0.5, "blocks[max(1, int(0.5 * len(blocks) + 0.5)):]"),
        (0.0, "blocks[:]"),
    ):
        config = FSDP2.render_config(_fsdp2(checkpoint_fraction=fraction, activation_offload="cpu"))
        assert config["activation_offload"] == "cpu"
        code = "\n".join(FSDP2.code_lines(config))
        assert f"offload_blocks({kept})" in code
        compile(code.replace("torch.optim", "optim"), "<summary>", "exec")


@pytest.mark.parametrize(
    ("fraction", "blocks"), [(0.375, 12), (0.25, 2), (0.5, 5), (0.1, 4), (1.0, 7)]
)
def test_the_code_lines_count_the_blocks_the_probes_recomputed(
    fraction: float, blocks: int
) -> None:
    """Where Python's round (halves to even, and to 0) and the probes' count differ."""
    from autotune.backends.fsdp2._export_text import recomputed_count
    from autotune.workloads.checkpointing import checkpointed_block_count

    count = eval(recomputed_count(fraction), {"blocks": list(range(blocks))})
    assert count == checkpointed_block_count(fraction, blocks)
