"""DeepSpeed's engine on a probe's rank: its process group, the model built partitioned at
ZeRO-3, and ``deepspeed.initialize`` around it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.candidate import Candidate


def start_process_group() -> None:
    """``deepspeed.init_distributed`` with the communication backend of
    :func:`~autotune.backends._process_group.process_group_backend` for DeepSpeed's
    accelerator: DeepSpeed 0.19 hands ``dist_backend`` to ``torch.distributed.
    init_process_group`` unchanged (``comm/torch.py``, ``TorchBackend``), so on CUDA the group
    has gloo for host tensors beside NCCL. A group already started (by an FSDP2 candidate
    of the same warm rank) is kept."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    from autotune.backends._process_group import process_group_backend

    deepspeed.init_distributed(dist_backend=process_group_backend(get_accelerator().device_name()))


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


def initialize_engine(model: Any, config: dict[str, Any], units: list[Any] | None = None) -> Any:
    """DeepSpeed's engine over ``model``, stepping its trainable parameters (``units`` are
    FSDP2's: unused)."""
    del units
    import deepspeed

    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=config,
    )
    return engine


def whole_parameters(model: Any) -> contextlib.AbstractContextManager[Any]:
    """A context under which every parameter of ``model`` is whole: at ZeRO-3 (a model
    built under ``zero.Init``) gathered from its partitions, what rank 0 writes to them
    partitioned again on exit (``deepspeed.zero.GatheredParameters`` with
    ``modifier_rank=0``); a model built whole as it is."""
    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not params:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=0)
