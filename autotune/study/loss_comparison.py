"""Does the winner train the same as the reference? Two loss curves of the same seed, the
same data and the same global batch, compared step by step (:func:`compare`).

**Tolerance.** The loss of step s carries the rounding of its own forward and of the s
updates before it. In the standard model of floating-point arithmetic each operation is
exact but for a relative error of at most the unit roundoff u (Higham, "Accuracy and
Stability of Numerical Algorithms", 2nd ed., 2002, §2.2): u = 2^-24 for fp32, 2^-11 for
fp16, 2^-8 for bf16. Each step's own relative error in the loss is taken as at most c·u
with c = 2 (the forward's rounding and the update's), the steps' errors as independent:
by Hoeffding's inequality, as Higham and Mary apply it ("A New Approach to Probabilistic
Rounding Error Analysis", SIAM J. Sci. Comput. 41(5), 2019, Lemma 2.1), their sum stays
within λ·c·u·√(s+1) with probability at least 1 − 2·exp(−λ²/2); with λ = 4 (≥ 0.9993)::

    rtol(s) = 8 · u · √(s + 1)

so errors of rounding grow as a random walk, with the square root of the steps (Higham
§2.8), not linearly. Two runs are compared at the coarser of their precisions: bf16's
tolerance is 3.1% at the first step and 9.9% at the tenth (Megatron-LM's functional tests
hold bf16 losses to golden values within rtol 0.05); fp32's is under 1e-6 for a hundred
steps, far below what a real difference in training moves.

**Verdicts** (:data:`Verdict`, in this order):

- "cannot judge": the reference's loss is not finite, the runs started from different
  weights, two runs of the reference itself disagree beyond the reference precision's
  tolerance (its data order or initialisation is not reproducible), or a script's runs
  trained on other samples in some step (``LossTrace.sample_digests``: the repeat's, a data
  order that is not reproducible; the winner's, one that depends on the batch split);
- "differs": the first step where the winner's loss is NaN or inf, the fp16 loss scaler
  skipped it (overflow), or its loss or gradient norm (where both runs report one) is off
  the reference's by more than the coarser precision's tolerance, with the likely cause;
- "trains the same": every step within fp32's tolerance;
- "drifts within the tolerance of <precision>": within the coarser precision's.

**Likely cause** of a difference, the first that applies: a model with batch statistics
(BatchNorm) at another micro-batch, "micro-batch-dependent statistics"; a coarser winner
precision (a NaN, an overflow skip, rounded-away updates), "precision"; gradient clipping
that bites (a reported norm at or above the threshold, or none reported), "clipping"; another
split of the global batch into micro-batches, "loss normalisation"; else the optimizer's
own numerics between ZeRO stages and offload (CPU Adam), "optimizer numerics".
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune.candidate import Candidate
from autotune.protocol import LossTrace

Verdict = Literal["trains the same", "drifts", "differs", "cannot judge"]
Cause = Literal[
    "precision",
    "micro-batch-dependent statistics",
    "loss normalisation",
    "clipping",
    "optimizer numerics",
]
# Unit roundoff u = 2^-(p) of a p-bit significand (Higham 2002, Table 2.1; bf16 keeps 8 bits).
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}
# rtol(s) = LAMBDA * STEP_ERROR * u * sqrt(s + 1): see the module docstring.
LAMBDA = 4.0
STEP_ERROR = 2.0


class ComparedRun(BaseModel):
    """One run as the comparison sees it: its candidate and what it recorded."""

    model_config = ConfigDict(extra="forbid")

    candidate: Candidate = Field(description="The configuration the run trained with.")
    trace: LossTrace = Field(description="What its loss run recorded.")


class LossComparison(BaseModel):
    """The comparison's outcome."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    verdict: Verdict = Field(description="The kind of outcome (see the module docstring).")
    text: str = Field(description="The verdict in one line, as status and summary.md show it.")
    precision: str = Field(description="The precision whose tolerance the winner was held to.")
    step: int | None = Field(
        default=None, description="The first step that differs or disagrees (0-based)."
    )
    cause: Cause | None = Field(default=None, description="The likely cause of a difference.")
    max_relative_difference: float = Field(
        default=0.0,
        description="The largest relative loss difference of the winner against the "
        "reference over the steps compared (inf where a loss is not finite).",
    )
    tolerance_at_max: float = Field(
        default=0.0, description="The coarser precision's tolerance at that step."
    )


def tolerance(precision: str, step: int) -> float:
    """rtol(s) = 8·u·√(s+1) of ``precision`` at 0-based ``step`` (module docstring)."""
    return LAMBDA * STEP_ERROR * UNIT_ROUNDOFF[precision] * math.sqrt(step + 1)


def coarser(first: str, second: str) -> str:
    """The precision with the larger unit roundoff."""
    return max(first, second, key=lambda p: UNIT_ROUNDOFF[p])


def relative_difference(value: float, reference: float) -> float:
    """|value − reference| / |reference| (inf where either is not finite and they differ)."""
    if not (math.isfinite(value) and math.isfinite(reference)):
        return 0.0 if value == reference else math.inf
    if value == reference:
        return 0.0
    return abs(value - reference) / max(abs(reference), 1e-30)


def compare(
    reference: ComparedRun, winner: ComparedRun, repeat: ComparedRun | None = None
) -> LossComparison:
    """The verdict on ``winner`` against ``reference`` (and ``repeat``, a second run of the
    reference, whose disagreement means "cannot judge"); see the module docstring."""
    precision = coarser(reference.candidate.precision, winner.candidate.precision)
    unjudgeable = _cannot_judge(reference, winner, repeat)
    if unjudgeable is not None:
        return unjudgeable
    ref, won = reference.trace, winner.trace
    worst = _worst(ref.losses, won.losses, precision)
    for step in range(min(len(ref.losses), len(won.losses))):
        why = _difference_at(reference, winner, step, precision)
        if why:
            cause = likely_cause(reference, winner, step)
            grows = _growth(ref.losses, won.losses, step)
            return LossComparison(
                verdict="differs",
                text=f"differs: step {step}, {why}{grows}, likely cause: {cause}",
                precision=precision,
                step=step,
                cause=cause,
                **worst,
            )
    same = all(
        relative_difference(w, r) <= tolerance("fp32", s)
        for s, (r, w) in enumerate(zip(ref.losses, won.losses, strict=False))
    )
    if same:
        return LossComparison(
            verdict="trains the same", text="trains the same", precision=precision, **worst
        )
    return LossComparison(
        verdict="drifts",
        text=f"drifts within the tolerance of {precision}",
        precision=precision,
        **worst,
    )


def _worst(reference: list[float], winner: list[float], precision: str) -> dict[str, float]:
    """The largest relative difference over the steps and the tolerance at its step."""
    pairs = [
        (relative_difference(w, r), s)
        for s, (r, w) in enumerate(zip(reference, winner, strict=False))
    ]
    if not pairs:
        return {"max_relative_difference": 0.0, "tolerance_at_max": 0.0}
    difference, step = max(pairs)
    return {"max_relative_difference": difference, "tolerance_at_max": tolerance(precision, step)}


def _cannot_judge(
    reference: ComparedRun, winner: ComparedRun, repeat: ComparedRun | None
) -> LossComparison | None:
    """ "cannot judge" when the reference itself is no yardstick, else None."""
    ref = reference.trace
    precision = coarser(reference.candidate.precision, winner.candidate.precision)

    def verdict(step: int | None, why: str) -> LossComparison:
        return LossComparison(
            verdict="cannot judge", text=f"cannot judge: {why}", precision=precision, step=step
        )

    infinite = next((s for s, loss in enumerate(ref.losses) if not math.isfinite(loss)), None)
    if infinite is not None:
        return verdict(
            infinite, f"the reference's loss is {ref.losses[infinite]} at step {infinite}"
        )
    if repeat is not None and repeat.trace.initial_weights_sha256 != ref.initial_weights_sha256:
        return verdict(
            None,
            "two runs of the reference started from different initial weights: its "
            "initialisation is not reproducible (seeded from the clock?)",
        )
    if winner.trace.initial_weights_sha256 != ref.initial_weights_sha256:
        return verdict(
            None,
            "the runs did not start from the same initial weights (a model built otherwise "
            "for the winner's configuration, e.g. under zero.Init at ZeRO-3?)",
        )
    if repeat is None:
        return _other_samples(ref, winner.trace, verdict)
    step = _first_other_samples(ref, repeat.trace)
    if step is not None:
        return verdict(
            step,
            f"two runs of the reference trained on other samples at step {step}: the "
            "script's data order is not reproducible (a sampler or loader workers seeded from "
            "the clock?)",
        )
    own = reference.candidate.precision
    for step, (first, second) in enumerate(zip(ref.losses, repeat.trace.losses, strict=False)):
        difference = relative_difference(second, first)
        if difference > tolerance(own, step):
            return verdict(
                step,
                f"two runs of the reference disagree at step {step} ({second:.6g} against "
                f"{first:.6g}, {_percent(difference)} off, beyond {own}'s tolerance of "
                f"{_percent(tolerance(own, step))}): its data order or initialisation is not "
                "reproducible",
            )
    return _other_samples(ref, winner.trace, verdict)


def _other_samples(reference: LossTrace, winner: LossTrace, verdict: Any) -> LossComparison | None:
    """ "cannot judge" where the winner trained on other samples than the reference."""
    step = _first_other_samples(reference, winner)
    if step is None:
        return None
    return verdict(
        step,
        f"the winner trained on other samples than the reference at step {step}: the "
        "script's data order depends on the micro-batch or accumulation; draw it from a seed "
        "alone (e.g. a sampler over samples, batched after)",
    )


def _first_other_samples(reference: LossTrace, other: LossTrace) -> int | None:
    """The first step whose samples differ, where both runs recorded them (a script's)."""
    if reference.sample_digests is None or other.sample_digests is None:
        return None
    pairs = zip(reference.sample_digests, other.sample_digests, strict=False)
    return next((step for step, (a, b) in enumerate(pairs) if a != b), None)


def _difference_at(reference: ComparedRun, winner: ComparedRun, step: int, precision: str) -> str:
    """Why the winner differs at ``step`` ('' if it does not)."""
    ref_loss, loss = reference.trace.losses[step], winner.trace.losses[step]
    if not math.isfinite(loss):
        return f"the loss is {loss} (the reference's {ref_loss:.6g})"
    if _at(winner.trace.skipped, step) and not _at(reference.trace.skipped, step):
        return "the fp16 loss scaler skipped it (overflow)"
    allowed = tolerance(precision, step)
    difference = relative_difference(loss, ref_loss)
    if difference > allowed:
        return (
            f"loss {loss:.6g} against the reference's {ref_loss:.6g} ({_percent(difference)} "
            f"off, tolerance {_percent(allowed)})"
        )
    ref_norm, norm = _at(reference.trace.grad_norms, step), _at(winner.trace.grad_norms, step)
    if ref_norm is not None and norm is not None:
        difference = relative_difference(norm, ref_norm)
        if difference > allowed:
            return (
                f"gradient norm {norm:.6g} against the reference's {ref_norm:.6g} "
                f"({_percent(difference)} off, tolerance {_percent(allowed)})"
            )
    return ""


def likely_cause(reference: ComparedRun, winner: ComparedRun, step: int) -> Cause:
    """The likeliest reason the winner's training differs from step ``step`` on (module
    docstring, "Likely cause")."""
    ref, won = reference.candidate, winner.candidate
    split_differs = (ref.micro_batch_size, ref.gradient_accumulation_steps) != (
        won.micro_batch_size,
        won.gradient_accumulation_steps,
    )
    if split_differs and (reference.trace.batch_statistics or winner.trace.batch_statistics):
        return "micro-batch-dependent statistics"
    if UNIT_ROUNDOFF[won.precision] > UNIT_ROUNDOFF[ref.precision]:
        return "precision"
    if _clipping_bites(reference, winner, step):
        return "clipping"
    if split_differs:
        return "loss normalisation"
    return "optimizer numerics"


def _clipping_bites(reference: ComparedRun, winner: ComparedRun, step: int) -> bool:
    """Clipping is on and, up to ``step``, a reported gradient norm reached its threshold
    (or neither run reports one, so that it may have)."""
    threshold = max(reference.trace.gradient_clipping, winner.trace.gradient_clipping)
    if threshold <= 0:
        return False
    norms = [
        n for run in (reference, winner) for n in run.trace.grad_norms[: step + 1] if n is not None
    ]
    return not norms or any(n >= threshold for n in norms)


def _growth(reference: list[float], winner: list[float], step: int) -> str:
    """ ", growing to X by step N" when the gap at the last step is wider than at ``step``."""
    last = min(len(reference), len(winner)) - 1
    if last <= step:
        return ""
    first_gap = relative_difference(winner[step], reference[step])
    last_gap = relative_difference(winner[last], reference[last])
    if last_gap > first_gap:
        return f", growing to {_percent(last_gap)} by step {last}"
    return ""


def _at(values: list[Any], step: int) -> Any:
    return values[step] if step < len(values) else None


def _percent(value: float) -> str:
    if not math.isfinite(value):
        return "inf"
    return f"{100 * value:.2g}%"
