"""The best trial (or a chosen one) -> the three files a user takes to production.

The backend's config file (``ds_config.json``: the base config with the tuned values, checked
by the backend, for DeepSpeed by its own config class for the tuned world size), ``launch.sh``
(the backend's launch commands for the user's script) and ``summary.md`` (see
:mod:`autotune.export._summary`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from autotune.backends import get_backend
from autotune.errors import ExportError
from autotune.export._production_config import production_config
from autotune.study import best, records, study_config

if TYPE_CHECKING:
    import optuna

    from autotune.study import Best, StudyConfig, TrialView


class Exported(BaseModel):
    """Where the export went, and what it holds."""

    model_config = ConfigDict(extra="forbid")

    trial: int
    label: str
    folder: str
    backend: str  # the training library the config is for (the backend registry's name)
    config_file: str  # the backend's config file (ds_config.json, fsdp2_config.json)
    launch: str
    summary: str


def _block_class(trial: TrialView, config: StudyConfig) -> str:
    """The class name of the workload's transformer blocks, FSDP2's units, from its model
    built on the meta device ("" for a backend that does not shard by block, a script's
    model or a model without blocks)."""
    from autotune.backends import get_backend

    if config.script is not None or not get_backend(trial.candidate.backend).shards_by_block:
        return ""
    import torch

    from autotune.workloads import get_workload
    from autotune.workloads.blocks import block_units

    with torch.device("meta"):
        units = block_units(get_workload(config.workload).build_model())
    return type(units[0]).__name__ if units else ""


def choose_trial(study: optuna.Study, number: int | None) -> tuple[TrialView, Best | None]:
    """The trial to export (the best by :func:`autotune.study.best.decide_best` unless ``number``
    names one) and the best, which the summary describes."""
    from autotune import training_goal
    from autotune.study import confirmation as confirm
    from autotune.study import loss_checks as checks

    trials = records.views(study)
    decided = best.decide_best(
        trials, confirm.load(study), checks.set_aside(study), training_goal.of_study(study)
    )
    if number is None:
        if decided is None:
            raise ExportError(
                f"study {study.study_name!r} has no feasible measured trial yet; run "
                f"autotune run --study {study.study_name} to probe more candidates"
            )
        return trials[decided.trial], decided
    if not 0 <= number < len(trials):
        raise ExportError(
            f"--trial {number}: study {study.study_name!r} has trials 0-{len(trials) - 1}"
        )
    trial = trials[number]
    if trial.feasible:
        return trial, decided
    if trial.record.duplicate_of is not None:
        reason = f"it repeats trial {trial.record.duplicate_of}"
    elif trial.status == "ok" and trial.record.stopped_early:
        reason = "its probe was stopped early (a partial measurement)"
    elif trial.status == "ok":  # its error says which limit (records before host ones: none)
        reason = trial.record.error or "its peak memory exceeded the limit"
    else:
        reason = f"its status is {trial.status!r}"
    feasible = ", ".join(str(t.number) for t in records.ranked_feasible(trials)[:10]) or "none"
    raise ExportError(f"--trial {number} cannot be exported: {reason}; feasible: {feasible}")


def export(study: optuna.Study, out_dir: Path, *, trial_number: int | None = None) -> Exported:
    """Write ds_config.json, launch.sh and summary.md for the chosen trial into ``out_dir``."""
    from autotune.export._summary import render_launch, render_summary

    config = study_config(study)
    if config is None:
        raise ExportError(f"study {study.study_name!r} was not made by autotune run")
    trial, decided = choose_trial(study, trial_number)
    backend_config = production_config(trial, config)
    checked = backend_config
    if config.script is not None:  # "auto" values are the Trainer's to fill
        from autotune.export._script_export import without_autos

        checked = without_autos(backend_config)
    backend = get_backend(trial.candidate.backend)
    ranks = trial.candidate.data_parallel_size
    backend.validate_config(checked, ranks, config.accelerator)
    files = {
        backend.config_file_name: json.dumps(backend_config, indent=2, sort_keys=True) + "\n",
        **backend.export_files(
            backend_config, ranks, config.accelerator, _block_class(trial, config)
        ),
        "launch.sh": render_launch(study.study_name, trial, config),
        "summary.md": render_summary(study, trial, config, decided),
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
        label=trial.label,
        folder=str(out_dir),
        backend=backend.name,
        config_file=str(out_dir / backend.config_file_name),
        launch=str(out_dir / "launch.sh"),
        summary=str(out_dir / "summary.md"),
    )
