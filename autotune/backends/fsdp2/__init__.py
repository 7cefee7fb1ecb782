"""torch's FSDP2 as a training backend (:class:`Fsdp2Backend`): a candidate as an FSDP2
config, ``fully_shard`` over the model's blocks on the rank and the engine the probe times,
FSDP2's memory terms, and the export's accelerate config and launch."""

from autotune.backends.fsdp2._backend import Fsdp2Backend
from autotune.backends.fsdp2._config import (
    Fsdp2Config,
    render_fsdp2_config,
    validate_fsdp2_config,
)
from autotune.backends.fsdp2._engine import Fsdp2Engine, fully_shard_arguments

__all__ = [
    "Fsdp2Backend",
    "Fsdp2Config",
    "Fsdp2Engine",
    "fully_shard_arguments",
    "render_fsdp2_config",
    "validate_fsdp2_config",
]
