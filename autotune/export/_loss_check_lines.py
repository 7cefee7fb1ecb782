"""summary.md's loss-check lines: the trials ``run --verify strict`` set aside, and the chosen
trial's check against its reference step by step (:mod:`autotune.study.loss_checks`)."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from autotune.backends import printable

if TYPE_CHECKING:
    import optuna

    from autotune.protocol import LossTrace
    from autotune.study import TrialView


def set_aside_lines(
    study: optuna.Study, trials: list[TrialView], aside: Collection[int]
) -> list[str]:
    """A line per trial ``run --verify strict`` set aside: what it measured and why."""
    from autotune.study import loss_checks as checks

    lines = []
    for number in sorted(aside):
        check = checks.load(study, number)
        if check is None or not trials[number].feasible:
            continue
        lines.append(
            f"- Set aside by its loss check (`--verify strict`): trial {number} "
            f"({check.label}), {float(trials[number].value or 0.0):.1f} samples/s in its "
            f"search probe, {check.verdict.text}."
        )
    return lines


def loss_check_lines(study: optuna.Study, number: int) -> list[str]:
    """The trial's loss check against its reference (``autotune verify``), step by step."""
    from autotune.study import loss_checks as checks

    check = checks.load(study, number)
    lines = ["## Loss check", ""]
    if check is None:
        return [
            *lines,
            f"Not run. `autotune verify --study {printable(study.study_name)} --trial "
            f"{number}` trains this configuration and a reference (your base config, else "
            "fp32 at ZeRO-0) from one seed on one global batch and compares their losses "
            "step by step.",
        ]
    verdict = check.verdict
    lines.append(
        f"This configuration and its reference, {check.reference_label} "
        f"({check.reference_reason}), trained from seed {check.seed} on one global batch for "
        f"{check.steps} optimizer step(s): **{verdict.text}**."
    )
    by_role = {run.role: run for run in check.runs}
    reference, winner = by_role.get("reference"), by_role.get("winner")
    if reference is None or winner is None or reference.trace is None or winner.trace is None:
        return lines
    lines += [
        "",
        f"Tolerance: 8·u·√(step+1) of the coarser precision ({verdict.precision}, u its unit "
        "roundoff), each step's loss the mean over the global batch.",
        *_script_check_lines(study, reference.trace),
        "",
        "| step | reference loss | this configuration's loss | relative difference |",
        "| --- | --- | --- | --- |",
    ]
    from autotune.study.loss_comparison import relative_difference

    pairs = zip(reference.trace.losses, winner.trace.losses, strict=False)
    for step, (ref, won) in enumerate(pairs):
        difference = relative_difference(won, ref)
        lines.append(f"| {step} | {ref:.6g} | {won:.6g} | {100 * difference:.2g}% |")
    return lines


def _script_check_lines(study: optuna.Study, trace: LossTrace) -> list[str]:
    """What a script's check held equal and what it could not (none for a built-in
    workload, whose runs make their weights and samples themselves)."""
    from autotune.study import study_config

    config = study_config(study)
    if config is None or config.script is None:
        return []
    samples = (
        "each step's samples were the same in every run (digests of the micro-batches' "
        "integer inputs over every rank)"
        if trace.sample_digests is not None
        else "the samples could not be compared (the inputs hold no integer tensor): the "
        "reference's repeat alone says its data order is reproducible"
    )
    return [
        "",
        "Your script ran as it is: autotune seeded python, numpy and torch before it and "
        "switched its torch.nn dropout (and a diffusers class-label dropout) off; what the "
        "script seeds itself and functional dropout in its code are its own. The runs "
        "started from the same weights, and "
        f"{samples}.",
    ]
