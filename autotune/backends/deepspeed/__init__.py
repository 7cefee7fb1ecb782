"""DeepSpeed: its JIT ops, built once with the environment's own tools and loaded under
kernel locks."""

from autotune.backends.deepspeed._ds_config import script_ds_config
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
    "PRELOAD_OPS_VARIABLE",
    "adam_builder",
    "async_io_problem",
    "ensure_deepspeed_ops",
    "guard_op_loads",
    "partial_offload_supported",
    "preload_built_ops",
    "script_ds_config",
    "tools_path",
    "torch_extensions_dir",
    "use_torch_adam",
]
