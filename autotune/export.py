"""Best feasible trial -> the three files a user takes to production.

``ds_config.json`` (the base config with the tuned values, checked by DeepSpeed's own config
class for the tuned world size), ``launch.sh`` (the deepspeed launcher and torchrun commands
for the user's script) and ``summary.md`` (see :mod:`autotune.summary`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

from pydantic import BaseModel, ConfigDict

from autotune.candidate import Candidate
from autotune.errors import ExportError
from autotune.study import is_duplicate, is_repeat, study_config

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from autotune.study import StudyConfig


class Exported(BaseModel):
    """Where the export went, and what it holds."""

    model_config = ConfigDict(extra="forbid")

    trial: int
    label: str
    ds_config: str
    launch: str
    summary: str


def feasible_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Measured trials that stayed within the limit, fastest first."""
    from optuna.trial import TrialState

    feasible = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.user_attrs.get("feasible") and not is_repeat(t) and t.value is not None
    ]
    return sorted(feasible, key=lambda t: t.value, reverse=True)


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The fastest COMPLETE trial whose peak memory stayed within the limit."""
    from autotune.confirm import load

    ranked = feasible_trials(study)
    if not ranked:
        return None
    verdict = load(study)
    if verdict is None or verdict.winner is None:
        return ranked[0]
    by_number = {t.number: t for t in ranked}
    winner = by_number.get(verdict.winner)
    # A trial measured after the round that beats the confirmed mean outright wins instead.
    newer = [t for t in ranked if t.number > verdict.after_trial]
    if winner is None or (newer and newer[0].value > verdict.contenders[0].mean):
        return ranked[0]
    return winner


def validate_ds_config(config: dict[str, Any], world_size: int) -> None:
    """Have DeepSpeed's own config class parse ``config`` for ``world_size`` ranks.

    ``DeepSpeedConfig`` reads the world size from ``deepspeed.comm``, which needs a live
    process group; we tell it the tuned world size instead, and keep everything else real
    (the batch-size assertion train_batch = micro x accumulation x world is the one that
    depends on it).
    """
    import deepspeed.comm
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        with (
            mock.patch.object(deepspeed.comm, "get_rank", return_value=0),
            mock.patch.object(deepspeed.comm, "get_world_size", return_value=world_size),
        ):
            DeepSpeedConfig(json.loads(json.dumps(config)))
    except Exception as exc:  # noqa: BLE001 - DeepSpeed raises assertion, value, pydantic errors
        first = _error_line(exc)
        raise ExportError(
            f"DeepSpeed rejects the config for {world_size} rank(s): {first}"
        ) from None


def _error_line(exc: Exception) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        return f"{exc.title}: {where + ': ' if where else ''}{error['msg']}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def production_config(trial: FrozenTrial, config: StudyConfig) -> dict[str, Any]:
    """The trial's candidate over the user's base config, with the user's NVMe path."""
    candidate = Candidate.model_validate(trial.user_attrs["candidate"])
    return candidate.to_ds_config(config.base_config, nvme_path=config.nvme_path)


def choose_trial(study: optuna.Study, number: int | None) -> FrozenTrial:
    ranked = feasible_trials(study)
    if number is None:
        if not ranked:
            raise ExportError(
                f"study {study.study_name!r} has no feasible measured trial yet; run "
                f"autotune run --study {study.study_name} to probe more candidates"
            )
        return ranked[0]
    trials = study.get_trials(deepcopy=False)
    if not 0 <= number < len(trials):
        raise ExportError(
            f"--trial {number}: study {study.study_name!r} has trials 0-{len(trials) - 1}"
        )
    trial = trials[number]
    if trial in ranked:
        return trial
    status = trial.user_attrs.get("status", trial.state.name.lower())
    if is_duplicate(trial):
        reason = f"it repeats trial {trial.user_attrs['duplicate_of']}"
    elif status == "ok":
        reason = "its peak memory exceeded the limit"
    else:
        reason = f"its status is {status!r}"
    feasible = ", ".join(str(t.number) for t in ranked[:10]) or "none"
    raise ExportError(f"--trial {number} cannot be exported: {reason}; feasible: {feasible}")


def export(study: optuna.Study, out_dir: Path, *, trial_number: int | None = None) -> Exported:
    """Write ds_config.json, launch.sh and summary.md for the chosen trial into ``out_dir``."""
    from autotune.summary import render_launch, render_summary

    config = study_config(study)
    if config is None:
        raise ExportError(f"study {study.study_name!r} was not made by autotune run")
    trial = choose_trial(study, trial_number)
    ds_config = production_config(trial, config)
    world_size = trial.user_attrs["candidate"]["data_parallel_size"]
    validate_ds_config(ds_config, world_size)
    files = {
        "ds_config.json": json.dumps(ds_config, indent=2, sort_keys=True) + "\n",
        "launch.sh": render_launch(study, trial, config),
        "summary.md": render_summary(study, trial, config),
    }
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out_dir / name).write_text(text, encoding="utf-8")
        (out_dir / "launch.sh").chmod(0o755)
    except OSError as exc:
        raise ExportError(
            f"cannot write to {out_dir}: {exc.strerror}; pass another -o folder"
        ) from None
    return Exported(
        trial=trial.number,
        label=trial.user_attrs.get("label", ""),
        ds_config=str(out_dir / "ds_config.json"),
        launch=str(out_dir / "launch.sh"),
        summary=str(out_dir / "summary.md"),
    )
