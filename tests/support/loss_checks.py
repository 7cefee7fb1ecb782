"""A stored loss check (``autotune verify``) made from synthetic loss series, for the tests
of how the study keeps it and how people see it."""

from __future__ import annotations

from autotune.candidate import Candidate
from autotune.protocol import LossTrace
from autotune.study import loss_checks as checks
from autotune.study.loss_comparison import ComparedRun, compare

WINNER = Candidate(
    precision="bf16",
    zero_stage=2,
    micro_batch_size=2,
    gradient_accumulation_steps=2,
    data_parallel_size=2,
)
REFERENCE = WINNER.model_copy(
    update={"precision": "fp32", "zero_stage": 0, "micro_batch_size": 4,
            "gradient_accumulation_steps": 1}
)  # fmt: skip


def trace(losses: list[float]) -> LossTrace:
    return LossTrace(
        losses=losses,
        grad_norms=[None] * len(losses),
        skipped=[False] * len(losses),
        initial_weights_sha256="abc",
        initial_weights_sq_sum=1.0,
        loaded_weights_sq_sum=1.0,
    )


def check(trial: int, losses: list[float]) -> checks.LossCheck:
    reference = [8.3, 8.2, 8.1]
    runs = [
        checks.LossCheckRun(role=role, label=c.label, candidate=c, status="ok", trace=trace(values))
        for role, c, values in (
            ("reference", REFERENCE, reference),
            ("reference repeat", REFERENCE, reference),
            ("winner", WINNER, losses),
        )
    ]
    compared = [ComparedRun(candidate=r.candidate, trace=r.trace) for r in runs]  # type: ignore[arg-type]
    return checks.LossCheck(
        trial=trial,
        label=WINNER.label,
        reference_label=REFERENCE.label,
        reference_rule="fp32 ZeRO-0",
        reference_reason="fp32 at ZeRO-0 without offload",
        steps=3,
        seed=0,
        runs=runs,
        verdict=compare(compared[0], compared[2], repeat=compared[1]),
    )
