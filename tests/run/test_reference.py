"""The reference rule of ``autotune verify``: the user's base config as DeepSpeed reads it,
else fp32 ZeRO-0 at the largest micro-batch that fits, else the smallest fp32 change from
the winner that fits."""

from __future__ import annotations

from autotune.candidate import Candidate
from autotune.run._reference import choose_reference, from_base_config

WINNER = Candidate(
    precision="bf16",
    zero_stage=2,
    micro_batch_size=2,
    gradient_accumulation_steps=4,
    data_parallel_size=2,
)  # global batch 16, 8 samples per rank


def everything_fits(candidate: Candidate) -> bool:
    return True


def test_without_a_base_config_fp32_zero0_at_the_largest_micro_batch_that_fits() -> None:
    reference = choose_reference(WINNER, None, everything_fits)
    assert reference.rule == "fp32 ZeRO-0"
    assert reference.candidate == Candidate(
        precision="fp32",
        zero_stage=0,
        micro_batch_size=8,
        gradient_accumulation_steps=1,
        data_parallel_size=2,
    )
    assert reference.candidate.train_batch_size == WINNER.train_batch_size

    def up_to_micro_batch_2(candidate: Candidate) -> bool:
        return candidate.micro_batch_size <= 2

    reference = choose_reference(WINNER, None, up_to_micro_batch_2)
    assert (
        reference.candidate.micro_batch_size,
        reference.candidate.gradient_accumulation_steps,
    ) == (2, 4)


def test_where_zero0_never_fits_the_nearest_fp32_change_of_the_winner() -> None:
    def stage_and_offload(candidate: Candidate) -> bool:
        return candidate.zero_stage == 3 and candidate.offload_optimizer == "cpu"

    reference = choose_reference(WINNER, None, stage_and_offload)
    assert reference.rule == "fp32 nearest the winner"
    assert reference.candidate == WINNER.model_copy(
        update={"precision": "fp32", "zero_stage": 3, "offload_optimizer": "cpu"}
    )
    reference = choose_reference(WINNER, None, lambda c: c.zero_stage == 2)
    assert reference.candidate == WINNER.model_copy(update={"precision": "fp32"})
    nothing = choose_reference(WINNER, None, lambda c: False)
    assert nothing.candidate == WINNER.model_copy(update={"precision": "fp32"})
    assert "may not fit" in nothing.reason


def test_a_base_config_is_the_reference_as_deepspeed_reads_it() -> None:
    # what it leaves out is DeepSpeed's default: fp32, ZeRO-0, one micro-batch per rank
    plain = {"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}, "gradient_clipping": 1.0}
    reference = choose_reference(WINNER, plain, lambda c: False)  # fits or not
    assert reference.rule == "base config"
    assert reference.candidate == Candidate(
        precision="fp32",
        zero_stage=0,
        micro_batch_size=8,
        gradient_accumulation_steps=1,
        data_parallel_size=2,
    )
    own = {
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}},
        "train_micro_batch_size_per_gpu": 4,
    }
    candidate = from_base_config(WINNER, own)
    assert (candidate.precision, candidate.zero_stage, candidate.offload_optimizer) == (
        "bf16",
        1,
        "cpu",
    )
    assert (candidate.micro_batch_size, candidate.gradient_accumulation_steps) == (4, 2)
    by_accumulation = from_base_config(
        WINNER, {"gradient_accumulation_steps": 8, "fp16": {"enabled": True}}
    )
    assert (by_accumulation.micro_batch_size, by_accumulation.precision) == (1, "fp16")
