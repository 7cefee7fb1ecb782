"""The loss comparison on synthetic loss series: each verdict, each likely cause, the
tolerance formula."""

from __future__ import annotations

import math

import pytest

from autotune.candidate import Candidate
from autotune.protocol import LossTrace
from autotune.study.loss_comparison import (
    UNIT_ROUNDOFF,
    ComparedRun,
    coarser,
    compare,
    relative_difference,
    tolerance,
)

REFERENCE_LOSSES = [8.33, 8.27, 8.21, 8.15, 8.09, 8.04]
REFERENCE = Candidate(
    precision="fp32", zero_stage=0, micro_batch_size=4, gradient_accumulation_steps=1,
    data_parallel_size=2,
)  # fmt: skip


def run(
    losses: list[float],
    *,
    candidate: Candidate = REFERENCE,
    norms: list[float | None] | None = None,
    skipped: list[bool] | None = None,
    weights: str = "w0",
    batch_statistics: bool = False,
    clipping: float = 0.0,
    samples: list[str] | None = None,
) -> ComparedRun:
    return ComparedRun(
        candidate=candidate,
        trace=LossTrace(
            losses=losses,
            grad_norms=norms if norms is not None else [None] * len(losses),
            skipped=skipped if skipped is not None else [False] * len(losses),
            initial_weights_sha256=weights,
            initial_weights_sq_sum=1.0,
            loaded_weights_sq_sum=1.0,
            batch_statistics=batch_statistics,
            gradient_clipping=clipping,
            sample_digests=samples,
        ),
    )


def winner(**changes: object) -> Candidate:
    return REFERENCE.model_copy(update=changes)


def scaled(losses: list[float], factors: list[float]) -> list[float]:
    return [loss * (1 + f) for loss, f in zip(losses, factors, strict=True)]


def test_the_tolerance_is_eight_unit_roundoffs_growing_with_the_root_of_the_steps() -> None:
    assert UNIT_ROUNDOFF == {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}
    assert tolerance("bf16", 0) == pytest.approx(8 * 2**-8)  # 3.1%
    assert tolerance("bf16", 3) == pytest.approx(2 * tolerance("bf16", 0))
    assert tolerance("fp32", 99) == pytest.approx(80 * 2**-24)  # under 1e-6
    assert coarser("fp32", "bf16") == "bf16" and coarser("fp16", "bf16") == "bf16"
    assert relative_difference(math.nan, 1.0) == math.inf
    assert relative_difference(math.inf, math.inf) == 0.0


def test_fp32_runs_within_rounding_of_each_other_train_the_same() -> None:
    # another ZeRO stage and split in fp32: differences of one or two fp32 roundings
    noise = [0.0, 1e-7, -6e-8, 3e-8, 0.0, 5e-8]
    verdict = compare(
        run(REFERENCE_LOSSES),
        run(scaled(REFERENCE_LOSSES, noise), candidate=winner(zero_stage=3, micro_batch_size=1,
                                                               gradient_accumulation_steps=4)),
    )  # fmt: skip
    assert verdict.verdict == "trains the same" and verdict.text == "trains the same"
    assert verdict.max_relative_difference == pytest.approx(1e-7, rel=1e-3)
    assert verdict.precision == "fp32"


def test_a_bf16_winner_a_few_roundings_off_drifts_within_bf16s_tolerance() -> None:
    drift = [1e-5, 2e-3, -3e-3, 4e-3, 4e-3, -5e-3]
    verdict = compare(
        run(REFERENCE_LOSSES),
        run(scaled(REFERENCE_LOSSES, drift), candidate=winner(precision="bf16", zero_stage=2)),
    )
    assert verdict.verdict == "drifts"
    assert verdict.text == "drifts within the tolerance of bf16"
    assert verdict.max_relative_difference == pytest.approx(5e-3, rel=1e-3)
    assert verdict.tolerance_at_max == pytest.approx(tolerance("bf16", 5))


def test_a_bf16_winner_off_by_more_than_its_tolerance_differs_at_that_step() -> None:
    off = [0.0, 1e-3, 2e-3, 0.08, 0.12, 0.2]  # 8% at step 3, where bf16 allows 6.25%
    verdict = compare(
        run(REFERENCE_LOSSES),
        run(scaled(REFERENCE_LOSSES, off), candidate=winner(precision="bf16")),
    )
    assert verdict.verdict == "differs" and verdict.step == 3 and verdict.cause == "precision"
    assert verdict.text.startswith("differs: step 3, loss 8.802 against the reference's 8.15 (8%")
    assert "tolerance 6.2%" in verdict.text
    assert "growing to 20% by step 5" in verdict.text
    assert verdict.text.endswith("likely cause: precision")


def test_an_fp32_winner_is_held_to_fp32s_tolerance() -> None:
    # 1e-5 is far inside bf16's tolerance but 1000 fp32 roundings off: another training
    off = [0.0, 0.0, 1e-5, 1e-5, 1e-5, 1e-5]
    verdict = compare(
        run(REFERENCE_LOSSES), run(scaled(REFERENCE_LOSSES, off), candidate=winner(zero_stage=2))
    )
    assert verdict.verdict == "differs" and verdict.step == 2
    assert verdict.cause == "optimizer numerics"


def test_a_nan_differs_at_its_step() -> None:
    losses = [*REFERENCE_LOSSES[:2], math.nan, math.nan, math.nan, math.nan]
    verdict = compare(run(REFERENCE_LOSSES), run(losses, candidate=winner(precision="bf16")))
    assert verdict.verdict == "differs" and verdict.step == 2
    assert verdict.text == (
        "differs: step 2, the loss is nan (the reference's 8.21), likely cause: precision"
    )
    assert verdict.max_relative_difference == math.inf


def test_a_step_the_fp16_loss_scaler_skipped_differs() -> None:
    skipped = [False, True, False, False, False, False]
    verdict = compare(
        run(REFERENCE_LOSSES),
        run(REFERENCE_LOSSES, candidate=winner(precision="fp16"), skipped=skipped),
    )
    assert verdict.verdict == "differs" and verdict.step == 1
    assert "the fp16 loss scaler skipped it (overflow)" in verdict.text
    assert verdict.cause == "precision"


def test_batch_statistics_at_a_smaller_micro_batch_are_the_likely_cause() -> None:
    off = [0.05, 0.06, 0.06, 0.07, 0.07, 0.08]  # beyond bf16's 3.1% from the first step
    smaller = winner(micro_batch_size=1, gradient_accumulation_steps=4, precision="bf16")
    verdict = compare(
        run(REFERENCE_LOSSES, batch_statistics=True),
        run(scaled(REFERENCE_LOSSES, off), candidate=smaller, batch_statistics=True),
    )
    assert verdict.verdict == "differs" and verdict.step == 0
    assert verdict.cause == "micro-batch-dependent statistics"


def test_another_split_without_batch_statistics_is_loss_normalisation() -> None:
    off = [0.0, 0.01, 0.01, 0.01, 0.01, 0.01]
    split = winner(micro_batch_size=2, gradient_accumulation_steps=2)
    verdict = compare(run(REFERENCE_LOSSES), run(scaled(REFERENCE_LOSSES, off), candidate=split))
    assert verdict.cause == "loss normalisation" and verdict.step == 1


def test_clipping_that_bites_is_the_likely_cause() -> None:
    off = [0.0, 0.01, 0.01, 0.01, 0.01, 0.01]
    norms: list[float | None] = [2.0, 1.5, 1.2, 1.0, 0.9, 0.8]
    stage = winner(zero_stage=2)
    verdict = compare(
        run(REFERENCE_LOSSES, clipping=1.0),
        run(scaled(REFERENCE_LOSSES, off), candidate=stage, norms=norms, clipping=1.0),
    )
    assert verdict.cause == "clipping"
    below: list[float | None] = [0.5] * 6  # never reaches the threshold: not clipping
    verdict = compare(
        run(REFERENCE_LOSSES, clipping=1.0),
        run(scaled(REFERENCE_LOSSES, off), candidate=stage, norms=below, clipping=1.0),
    )
    assert verdict.cause == "optimizer numerics"


def test_a_gradient_norm_off_differs_where_both_report_one() -> None:
    norms: list[float | None] = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    other: list[float | None] = [1.0, 1.0, 1.5, 1.0, 1.0, 1.0]
    stage = winner(zero_stage=2)
    verdict = compare(
        run(REFERENCE_LOSSES, candidate=winner(zero_stage=1), norms=norms),
        run(REFERENCE_LOSSES, candidate=stage, norms=other),
    )
    assert verdict.verdict == "differs" and verdict.step == 2
    assert "gradient norm 1.5 against the reference's 1" in verdict.text
    # the reference at ZeRO-0 fp32 reports none: nothing to compare
    verdict = compare(run(REFERENCE_LOSSES), run(REFERENCE_LOSSES, candidate=stage, norms=other))
    assert verdict.verdict == "trains the same"


def test_two_runs_of_the_reference_that_disagree_cannot_judge() -> None:
    repeat = [*REFERENCE_LOSSES[:3], 8.2, *REFERENCE_LOSSES[4:]]
    verdict = compare(run(REFERENCE_LOSSES), run(REFERENCE_LOSSES), repeat=run(repeat))
    assert verdict.verdict == "cannot judge" and verdict.step == 3
    assert verdict.text.startswith("cannot judge: two runs of the reference disagree at step 3")
    assert "not reproducible" in verdict.text
    same = compare(run(REFERENCE_LOSSES), run(REFERENCE_LOSSES), repeat=run(REFERENCE_LOSSES))
    assert same.verdict == "trains the same"


def test_a_reference_that_is_not_finite_or_other_weights_cannot_judge() -> None:
    broken = [8.33, math.inf, 8.2, 8.1, 8.0, 7.9]
    verdict = compare(run(broken), run(REFERENCE_LOSSES))
    assert verdict.verdict == "cannot judge" and verdict.step == 1
    assert "the reference's loss is inf at step 1" in verdict.text
    verdict = compare(run(REFERENCE_LOSSES), run(REFERENCE_LOSSES, weights="w1"))
    assert verdict.text.startswith(
        "cannot judge: the runs did not start from the same initial weights"
    )
    verdict = compare(
        run(REFERENCE_LOSSES), run(REFERENCE_LOSSES), repeat=run(REFERENCE_LOSSES, weights="w1")
    )
    assert verdict.text.startswith("cannot judge: two runs of the reference started from")
    assert "initialisation is not reproducible" in verdict.text


def test_a_script_whose_runs_trained_on_other_samples_cannot_judge() -> None:
    """A script's sample digests: the repeat's differ, a data order that is not
    reproducible; the winner's, one that depends on the split; runs without digests (a
    built-in workload, inputs with no integer tensor) are compared on their losses."""
    digests = [f"d{step}" for step in range(len(REFERENCE_LOSSES))]
    shuffled = [*digests[:2], "other", *digests[3:]]
    reference = run(REFERENCE_LOSSES, samples=digests)
    verdict = compare(reference, run(REFERENCE_LOSSES, samples=digests),
                      repeat=run(REFERENCE_LOSSES, samples=shuffled))  # fmt: skip
    assert verdict.verdict == "cannot judge" and verdict.step == 2
    assert "two runs of the reference trained on other samples at step 2" in verdict.text
    assert "not reproducible" in verdict.text
    split = winner(micro_batch_size=2, gradient_accumulation_steps=2)
    verdict = compare(reference, run(REFERENCE_LOSSES, candidate=split, samples=shuffled),
                      repeat=run(REFERENCE_LOSSES, samples=digests))  # fmt: skip
    assert verdict.verdict == "cannot judge" and verdict.step == 2
    assert "the winner trained on other samples than the reference at step 2" in verdict.text
    assert "depends on the micro-batch or accumulation" in verdict.text
    unrecorded = compare(reference, run(REFERENCE_LOSSES, candidate=split, samples=None))
    assert unrecorded.verdict == "trains the same"
    same = compare(reference, run(REFERENCE_LOSSES, candidate=split, samples=digests))
    assert same.verdict == "trains the same"
