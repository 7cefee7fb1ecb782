"""DeepSpeed's engine on a probe's rank: the model built partitioned at ZeRO-3, and
``deepspeed.initialize`` around it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.candidate import Candidate


def sharded_build(
    candidate: Candidate, config: dict[str, Any]
) -> contextlib.AbstractContextManager[Any] | None:
    """ZeRO-3 builds under ``deepspeed.zero.Init``: each parameter is partitioned (and cast
    to the config's dtype) as its module is constructed, so no rank ever holds the whole
    model. Other stages build whole (None)."""
    if candidate.zero_stage != 3:
        return None
    import deepspeed

    return deepspeed.zero.Init(config_dict_or_path=config)


def initialize_engine(model: Any, config: dict[str, Any]) -> Any:
    """DeepSpeed's engine over ``model``, stepping its trainable parameters."""
    import deepspeed

    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=config,
    )
    return engine
