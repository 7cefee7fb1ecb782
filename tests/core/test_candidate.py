"""Config rendering: every class of candidate renders a config DeepSpeed's parser accepts."""

from __future__ import annotations

import itertools

import pytest

from autotune.backends import get_backend
from autotune.backends.deepspeed import (
    DEFAULT_BASE_CONFIG,
    DEFAULT_PARAM_BUFFER_SIZE,
    validate_ds_config,
)
from autotune.candidate import ZERO_KNOB_STAGES, Candidate, ZeroKnobs, simpler_because
from autotune.errors import ExportError
from autotune.space.search_space import combination_problem

DEEPSPEED = get_backend("deepspeed")


def _candidates() -> list[Candidate]:
    out = []
    for precision, stage, opt, param, ckpt in itertools.product(
        ("fp32", "bf16", "fp16"),
        (0, 1, 2, 3),
        ("none", "cpu", "nvme"),
        ("none", "cpu", "nvme"),
        (False, True),
    ):
        if combination_problem(stage, opt, param) is None:
            out.append(
                Candidate(
                    precision=precision,
                    zero_stage=stage,
                    offload_optimizer=opt,
                    offload_param=param,
                    micro_batch_size=2,
                    gradient_accumulation_steps=4,
                    data_parallel_size=4,
                    activation_checkpointing=ckpt,
                )
            )
    # every fine ZeRO knob set, at every stage (each stage keeps only those it reads), and a
    # partial optimizer offload
    knobs = ZeroKnobs(
        overlap_comm=True,
        contiguous_gradients=False,
        reduce_bucket_size=50_000_000,
        allgather_bucket_size=50_000_000,
        stage3_prefetch_bucket_size=20_000_000,
        stage3_param_persistence_threshold=10_000,
        stage3_max_live_parameters=100_000_000,
        sub_group_size=100_000_000,
    )
    for stage in (0, 1, 2, 3):
        out.append(
            Candidate(
                precision="bf16",
                zero_stage=stage,
                micro_batch_size=2,
                gradient_accumulation_steps=4,
                data_parallel_size=4,
                zero_knobs=knobs,
            )
        )
    out.append(
        Candidate(
            precision="bf16",
            zero_stage=3,
            offload_optimizer="cpu",
            offload_optimizer_ratio=0.3,
            micro_batch_size=2,
            gradient_accumulation_steps=4,
            data_parallel_size=4,
        )
    )
    return out


def test_the_candidate_classes_cover_knobs_and_partial_offload() -> None:
    """The loops of the next test run: some candidates set knobs, one offloads partially."""
    candidates = _candidates()
    assert sum(1 for c in candidates if c.zero_knobs.items()) == 4
    assert any(c.offload_optimizer_ratio < 1 for c in candidates)


@pytest.mark.parametrize("candidate", _candidates(), ids=lambda c: c.label.replace(" ", "-"))
def test_deepspeed_accepts_every_class_of_candidate(candidate: Candidate) -> None:
    config = DEEPSPEED.render_config(candidate, nvme_path="/tmp/nvme")
    assert config["train_batch_size"] == 32
    assert config["zero_optimization"]["stage"] == candidate.zero_stage
    assert config["bf16"]["enabled"] == (candidate.precision == "bf16")
    assert config["fp16"]["enabled"] == (candidate.precision == "fp16")
    validate_ds_config(config, world_size=4)
    for name, value in candidate.zero_knobs.items():
        assert (config["zero_optimization"].get(name) == value) == (
            candidate.zero_stage in ZERO_KNOB_STAGES[name]
        )
    if candidate.offload_optimizer_ratio < 1:
        assert config["zero_optimization"]["offload_optimizer"]["ratio"] == 0.3


def test_fp16_uses_dynamic_loss_scaling() -> None:
    c = Candidate(
        precision="fp16",
        zero_stage=1,
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        data_parallel_size=1,
    )
    fp16 = DEEPSPEED.render_config(c)["fp16"]
    assert fp16["loss_scale"] == 0 and fp16["initial_scale_power"] == 16


def test_offload_blocks() -> None:
    c = Candidate(
        precision="bf16",
        zero_stage=3,
        offload_optimizer="cpu",
        offload_param="nvme",
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        data_parallel_size=1,
    )
    zero = DEEPSPEED.render_config(c, nvme_path="/nvme")["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert zero["offload_param"] == {"device": "nvme", "pin_memory": True, "nvme_path": "/nvme"}
    with pytest.raises(ValueError, match="nvme_path"):
        DEEPSPEED.render_config(c)


def test_nvme_param_buffer_holds_the_largest_partition() -> None:
    """DeepSpeed swaps each parameter partition through one buffer of offload_param.
    buffer_size elements and asserts it fits: the buffer grows to the largest partition."""
    c = Candidate(
        precision="bf16",
        zero_stage=3,
        offload_param="nvme",
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        data_parallel_size=4,
    )

    def buffer(largest: int | None = None) -> object:
        zero = DEEPSPEED.render_config(c, nvme_path="/nvme", largest_param_numel=largest)
        return zero["zero_optimization"]["offload_param"].get("buffer_size")

    assert buffer() is None  # DeepSpeed's 1e8 default
    assert buffer(10_000) == DEFAULT_PARAM_BUFFER_SIZE  # fits already
    # a 128256 x 8192 embedding (Llama 3 70B-like) over 4 ranks: 262,668,288 per rank
    assert buffer(128256 * 8192) == 262_668_288
    assert buffer(10**9 + 1) == 250_000_001  # rounded up, as DeepSpeed pads
    base = {"zero_optimization": {"offload_param": {"buffer_size": 1000, "buffer_count": 7}}}
    zero = DEEPSPEED.render_config(c, base, nvme_path="/nvme", largest_param_numel=8000)[
        "zero_optimization"
    ]
    assert zero["offload_param"]["buffer_size"] == 2000  # the base's, raised to the partition
    assert zero["offload_param"]["buffer_count"] == 7  # the base's tuning is kept
    cpu = c.model_copy(update={"offload_param": "cpu"})
    zero = DEEPSPEED.render_config(cpu, largest_param_numel=10**12)["zero_optimization"]
    assert "buffer_size" not in zero["offload_param"]  # only NVMe swaps through buffers


def test_base_offload_block_keeps_its_tuning_but_not_its_device() -> None:
    base = {
        "zero_optimization": {
            "offload_optimizer": {"device": "cpu", "pin_memory": False, "buffer_count": 8},
            "offload_param": {"device": "cpu", "max_in_cpu": 5},
        }
    }
    c = Candidate(
        precision="fp32",
        zero_stage=3,
        offload_optimizer="nvme",
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        data_parallel_size=1,
    )
    zero = DEEPSPEED.render_config(c, base, nvme_path="/nvme")["zero_optimization"]
    assert zero["offload_optimizer"] == {
        "device": "nvme",
        "nvme_path": "/nvme",
        "pin_memory": False,
        "buffer_count": 8,
    }
    assert "offload_param" not in zero  # the candidate offloads no parameters


def test_base_config_is_kept_and_tuned_keys_override() -> None:
    base = {
        "optimizer": {"type": "Adam", "params": {"lr": 3e-4}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100}},
        "gradient_clipping": 1.0,
        "zero_optimization": {
            "stage": 1,
            "offload_optimizer": {"device": "cpu"},
            "overlap_comm": True,
        },
        "fp16": {"enabled": True, "initial_scale_power": 12},
    }
    c = Candidate(
        precision="fp16",
        zero_stage=2,
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        data_parallel_size=2,
    )
    config = DEEPSPEED.render_config(c, base)
    assert config["scheduler"] == base["scheduler"]
    assert config["gradient_clipping"] == 1.0
    assert config["optimizer"] == base["optimizer"]
    assert config["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert config["fp16"]["initial_scale_power"] == 12  # the user's scaling wins
    assert base["zero_optimization"]["stage"] == 1  # the base is not mutated
    assert "optimizer" in DEFAULT_BASE_CONFIG


def test_partial_offload_outside_zero3_is_rejected_by_deepspeed() -> None:
    c = Candidate(
        precision="fp32",
        zero_stage=2,
        offload_optimizer="cpu",
        offload_optimizer_ratio=0.5,
        micro_batch_size=1,
        gradient_accumulation_steps=1,
        data_parallel_size=1,
    )
    with pytest.raises(ExportError, match="Partial offloading only supported for ZeRO Stage 3"):
        validate_ds_config(DEEPSPEED.render_config(c), world_size=1)


def test_labels() -> None:
    c = Candidate(
        precision="bf16",
        zero_stage=3,
        offload_optimizer="cpu",
        offload_optimizer_ratio=0.5,
        offload_param="nvme",
        micro_batch_size=2,
        gradient_accumulation_steps=4,
        data_parallel_size=2,
        activation_checkpointing=True,
        zero_knobs=ZeroKnobs(overlap_comm=True, reduce_bucket_size=50_000_000),
    )
    assert c.label == "z3 bf16 mb2x4 opt:cpu@0.5 param:nvme ckpt overlap=1 rbs=5e7"


def test_wrong_world_size_is_rejected_by_deepspeed() -> None:
    c = Candidate(
        precision="fp32",
        zero_stage=0,
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        data_parallel_size=2,
    )
    validate_ds_config(DEEPSPEED.render_config(c), world_size=2)
    with pytest.raises(ExportError, match="train_batch_size is not equal"):
        validate_ds_config(DEEPSPEED.render_config(c), world_size=4)


def test_the_simplicity_order_ranks_offload_then_checkpointing_stage_and_accumulation() -> None:
    def make(**changes: object) -> Candidate:
        base = {"precision": "bf16", "zero_stage": 1, "micro_batch_size": 4,
                "gradient_accumulation_steps": 2, "data_parallel_size": 2}  # fmt: skip
        return Candidate(**{**base, **changes})

    simplest_first = [
        make(zero_stage=0, gradient_accumulation_steps=1),
        make(zero_stage=0),
        make(),
        make(zero_stage=3),
        make(activation_checkpointing=True, zero_stage=0),
        make(offload_optimizer="cpu", zero_stage=0),
        make(zero_stage=3, offload_optimizer="cpu", offload_param="cpu"),
        make(zero_stage=3, offload_optimizer="nvme"),
    ]
    parts = [c.moving_parts for c in simplest_first]
    assert parts == sorted(parts) and len(set(parts)) == len(parts)
    because = [simpler_because(a, b) for a, b in itertools.pairwise(parts)]
    assert because == [
        "1 accumulation step, not 2",
        "ZeRO-0, not ZeRO-1",
        "ZeRO-1, not ZeRO-3",
        "no activation checkpointing",
        "no offload",
        "parameters stay on the device",
        "offloads to CPU, not NVMe",
    ]
    assert simpler_because(parts[1], parts[0]) == "" and simpler_because(parts[0], parts[0]) == ""


def _fraction(fraction: float) -> Candidate:
    return Candidate(
        precision="fp32",
        zero_stage=0,
        micro_batch_size=2,
        gradient_accumulation_steps=1,
        data_parallel_size=2,
        checkpoint_fraction=fraction,
    )


def test_all_or_none_of_the_blocks_is_stored_as_the_switch() -> None:
    """Records, keys and tables of studies stored before the fraction read and key alike:
    0 and 1 are written as ``activation_checkpointing``, in the field's place."""
    for fraction, switch in ((0.0, False), (1.0, True)):
        candidate = _fraction(fraction)
        dumped = candidate.model_dump(mode="json")
        assert dumped["activation_checkpointing"] is switch and "checkpoint_fraction" not in dumped
        names = list(dumped)
        assert names.index("activation_checkpointing") == names.index("data_parallel_size") + 1
        old = {**dumped}
        assert Candidate.model_validate(old) == candidate
        assert candidate.activation_checkpointing is switch
    half = _fraction(0.5)
    assert half.model_dump(mode="json")["checkpoint_fraction"] == 0.5
    assert "activation_checkpointing" not in half.model_dump()
    assert Candidate.model_validate_json(half.model_dump_json()) == half
    assert len({half.key, _fraction(1.0).key, _fraction(0.0).key}) == 3


def test_a_share_of_the_blocks_labels_and_orders_between_none_and_all() -> None:
    none, quarter, half, every = (_fraction(f) for f in (0.0, 0.25, 0.5, 1.0))
    assert [c.label for c in (none, quarter, half, every)] == [
        "z0 fp32 mb2x1",
        "z0 fp32 mb2x1 ckpt:0.25",
        "z0 fp32 mb2x1 ckpt:0.5",
        "z0 fp32 mb2x1 ckpt",
    ]
    assert none.moving_parts < quarter.moving_parts < half.moving_parts < every.moving_parts
    assert simpler_because(quarter.moving_parts, every.moving_parts) == "fewer blocks recomputed"
    assert simpler_because(none.moving_parts, half.moving_parts) == "no activation checkpointing"
    assert every.moving_parts[2] == 1 and isinstance(every.moving_parts[2], int)


def test_one_spelling_of_checkpointing_at_a_time() -> None:
    with pytest.raises(ValueError, match="not both"):
        Candidate.model_validate({**_fraction(0.5).model_dump(), "activation_checkpointing": True})
    with pytest.raises(ValueError, match="less than or equal to 1"):
        _fraction(1.5)


def test_the_selective_policy_is_stored_only_where_chosen() -> None:
    selective = _fraction(0.5).model_copy(update={"checkpoint_policy": "selective"})
    selective = Candidate.model_validate(selective.model_dump())  # validated as a record is
    assert selective.model_dump()["checkpoint_policy"] == "selective"
    assert "checkpoint_policy" not in _fraction(0.5).model_dump()
    assert selective.label == "z0 fp32 mb2x1 ckpt:0.5:sel"
    every = Candidate.model_validate(
        {**_fraction(1.0).model_dump(), "checkpoint_policy": "selective"}
    )
    assert every.label == "z0 fp32 mb2x1 ckpt:sel"
    assert simpler_because(_fraction(1.0).moving_parts, every.moving_parts) == (
        "recomputes its blocks in full, without a selective policy"
    )
    with pytest.raises(ValueError, match="where some block is recomputed"):
        Candidate.model_validate({**_fraction(0.0).model_dump(), "checkpoint_policy": "selective"})


def test_activation_offload_is_stored_only_where_chosen() -> None:
    """A candidate that keeps its activations on the device dumps and keys as before the
    field existed; one that offloads them names it, labels it and orders after."""
    kept = _fraction(0.5)
    offloaded = Candidate.model_validate({**kept.model_dump(), "activation_offload": "cpu"})
    assert "activation_offload" not in kept.model_dump(mode="json")
    assert offloaded.model_dump(mode="json")["activation_offload"] == "cpu"
    assert Candidate.model_validate_json(offloaded.model_dump_json()) == offloaded
    assert kept.key != offloaded.key and '"activation_offload"' not in kept.key
    assert offloaded.label == "z0 fp32 mb2x1 ckpt:0.5 act:cpu"
    none = Candidate.model_validate({**_fraction(0.0).model_dump(), "activation_offload": "cpu"})
    assert none.label == "z0 fp32 mb2x1 act:cpu"
    assert kept.moving_parts < offloaded.moving_parts
    assert kept.moving_parts[:-1] == offloaded.moving_parts[:-1]
    assert simpler_because(kept.moving_parts, offloaded.moving_parts) == (
        "activations kept on the device"
    )
    fsdp = Candidate(
        backend="fsdp2",
        precision="bf16",
        zero_stage=3,
        micro_batch_size=2,
        gradient_accumulation_steps=1,
        data_parallel_size=2,
        activation_offload="cpu",
    )
    assert fsdp.label.endswith(" act:cpu")


def test_activation_offload_needs_a_block_that_is_not_recomputed() -> None:
    with pytest.raises(ValueError, match="where some block is not recomputed"):
        Candidate.model_validate({**_fraction(1.0).model_dump(), "activation_offload": "cpu"})
    with pytest.raises(ValueError, match="activation_offload"):
        Candidate.model_validate({**_fraction(0.0).model_dump(), "activation_offload": "gpu"})
