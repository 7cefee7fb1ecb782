"""The loss check of a trial against its reference (``autotune verify``), as the study keeps
it: the study user attr :data:`LOSS_CHECKS_ATTR`, one entry per verified trial, read and
written only here. The comparison itself is :mod:`autotune.study.loss_comparison`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.candidate import Candidate
from autotune.errors import StorageError
from autotune.protocol import LossTrace
from autotune.study.loss_comparison import LossComparison

if TYPE_CHECKING:
    import optuna

LOSS_CHECKS_ATTR = "autotune_verification"
Role = Literal["reference", "reference repeat", "winner"]


class LossCheckRun(BaseModel):
    """One loss run of a loss check."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    role: Role = Field(description="The reference, its second run, or the verified trial.")
    label: str = Field(description="The run's configuration, short.")
    candidate: Candidate = Field(description="The run's configuration.")
    status: str = Field(description="ok, oom, error or timeout, as a probe's.")
    error: str = Field(default="", description="Why it failed, in one line.")
    wall_s: float = Field(default=0.0, description="Launch to result of its launch.")
    folder: str = Field(default="", description="Its spec, config, rank reports and log.")
    trace: LossTrace | None = Field(default=None, description="What it recorded.")


class LossCheck(BaseModel):
    """A trial's loss check: its reference and why, the runs, the verdict."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    trial: int = Field(description="The verified trial.")
    label: str = Field(description="Its configuration, short.")
    reference_label: str = Field(description="The reference's configuration, short.")
    reference_rule: str = Field(
        description="Which step of the reference rule chose it: base config, fp32 ZeRO-0, "
        "fp32 nearest the winner."
    )
    reference_reason: str = Field(description="Why this reference, in one line.")
    steps: int = Field(description="Optimizer steps each run trained.")
    seed: int = Field(description="The seed of every run's weights and randomness.")
    runs: list[LossCheckRun] = Field(description="Reference, its repeat, and the trial's run.")
    verdict: LossComparison = Field(description="What the comparison found.")
    seconds: float = Field(default=0.0, description="Wall time of the whole check.")
    set_aside: bool = Field(
        default=False,
        description="run --verify strict set the trial aside (its check differs): it is never "
        "the best, until a later check of it says otherwise.",
    )


def store(study: optuna.Study, check: LossCheck) -> None:
    """Keep ``check`` in the study, beside the other trials' checks."""
    kept = dict(study.user_attrs.get(LOSS_CHECKS_ATTR) or {})
    kept[str(check.trial)] = check.model_dump(mode="python")
    study.set_user_attr(LOSS_CHECKS_ATTR, kept)


def load_all(study: optuna.Study) -> dict[int, LossCheck]:
    """Every verified trial's check, by trial number."""
    raw = study.user_attrs.get(LOSS_CHECKS_ATTR) or {}
    try:
        return {int(number): LossCheck.model_validate(entry) for number, entry in raw.items()}
    except (ValidationError, ValueError, AttributeError):
        raise StorageError(
            f"study {study.study_name!r}: its stored loss checks ({LOSS_CHECKS_ATTR}) are not "
            "what this autotune reads (edited, or written by another version); run autotune "
            "verify again"
        ) from None


def set_aside(study: optuna.Study) -> frozenset[int]:
    """The trials ``run --verify strict`` set aside: never the best."""
    return frozenset(number for number, check in load_all(study).items() if check.set_aside)


def load(study: optuna.Study, trial: int) -> LossCheck | None:
    """Trial ``trial``'s check, if it was verified."""
    return load_all(study).get(trial)
