"""Best feasible trial -> a DeepSpeed config a user takes straight to production."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

from autotune.errors import ExportError
from autotune.study import is_duplicate

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The fastest COMPLETE trial whose peak memory stayed within the limit."""
    from optuna.trial import TrialState

    feasible = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.user_attrs.get("feasible") and not is_duplicate(t) and t.value is not None
    ]
    return max(feasible, key=lambda t: t.value, default=None)


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
    except Exception as exc:  # DeepSpeed raises AssertionError, ValueError, pydantic errors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(
            f"DeepSpeed rejects the config for {world_size} rank(s): {first}"
        ) from None


def export_trial(trial: FrozenTrial, out_dir: Path) -> Path:
    """Write ``ds_config.json`` of ``trial`` into ``out_dir`` after DeepSpeed accepts it."""
    config = trial.user_attrs.get("ds_config")
    candidate = trial.user_attrs.get("candidate")
    if config is None or candidate is None:
        raise ExportError(f"trial {trial.number} has no DeepSpeed config recorded")
    validate_ds_config(config, candidate["data_parallel_size"])
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "ds_config.json"
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    except OSError as exc:
        raise ExportError(f"cannot write to {out_dir}: {exc.strerror}; pass another -o") from None
    return path
