"""DeepSpeed as a training backend (:class:`DeepSpeedBackend`): its config, its engine on
the rank, ZeRO's memory terms, the export's config check, and its JIT ops, built once with
the environment's own tools and loaded under kernel locks."""

from autotune.backends.deepspeed._backend import DeepSpeedBackend
from autotune.backends.deepspeed._ds_config import (
    DEFAULT_BASE_CONFIG,
    DEFAULT_PARAM_BUFFER_SIZE,
    FP16_DYNAMIC_LOSS_SCALING,
    render_ds_config,
    script_ds_config,
)
from autotune.backends.deepspeed._validate import validate_ds_config
from autotune.backends.deepspeed._zero_phases import (
    DEFAULT_MAX_LIVE,
    DEFAULT_PERSISTENCE_THRESHOLD,
    DEFAULT_PREFETCH_BUCKET,
    DEFAULT_REDUCE_BUCKET,
)
from autotune.backends.deepspeed.ops import (
    PRELOAD_OPS_VARIABLE,
    adam_builder,
    async_io_problem,
    ensure_deepspeed_ops,
    guard_op_loads,
    partial_offload_supported,
    preload_built_ops,
    tools_path,
    torch_extensions_dir,
    use_torch_adam,
)

__all__ = [
    "DEFAULT_BASE_CONFIG",
    "DEFAULT_MAX_LIVE",
    "DEFAULT_PARAM_BUFFER_SIZE",
    "DEFAULT_PERSISTENCE_THRESHOLD",
    "DEFAULT_PREFETCH_BUCKET",
    "DEFAULT_REDUCE_BUCKET",
    "FP16_DYNAMIC_LOSS_SCALING",
    "PRELOAD_OPS_VARIABLE",
    "DeepSpeedBackend",
    "adam_builder",
    "async_io_problem",
    "ensure_deepspeed_ops",
    "guard_op_loads",
    "partial_offload_supported",
    "preload_built_ops",
    "render_ds_config",
    "script_ds_config",
    "tools_path",
    "torch_extensions_dir",
    "use_torch_adam",
    "validate_ds_config",
]
