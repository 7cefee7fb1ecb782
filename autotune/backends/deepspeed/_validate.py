"""A DeepSpeed config checked by DeepSpeed's own config class, as the export hands it over."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

from autotune.errors import ExportError


def validate_ds_config(config: dict[str, Any], world_size: int, accelerator: str = "cpu") -> None:
    """Have DeepSpeed's own config class parse ``config`` for ``world_size`` ranks.

    ``DeepSpeedConfig`` reads the world size from ``deepspeed.comm``, which needs a live
    process group; we tell it the tuned world size instead, and keep everything else real
    (the batch-size assertion train_batch = micro x accumulation x world is the one that
    depends on it).
    """
    import logging
    import os

    os.environ.setdefault("DS_ACCELERATOR", accelerator)  # else DeepSpeed warns as it guesses
    import deepspeed.comm
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.ERROR)  # its notes about the config are not the user's output
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
