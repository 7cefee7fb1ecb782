"""Training backends: what is specific to one training library (its config, its ops,
its engine on the rank, its memory terms, its export files), behind one interface
(:class:`TrainingBackend`) and a registry of them by name (:func:`get_backend`)."""

from autotune.backends._backend import (
    BACKEND_ROLES,
    BACKENDS,
    DEFAULT_BACKEND,
    BackendConfig,
    BackendEngine,
    BackendExportText,
    BackendMemory,
    BackendSupport,
    TrainingBackend,
    cpu_rank_libraries,
    get_backend,
    prepare_rank_process,
    register_backend,
)
from autotune.backends._memory_terms import ActivationProfile, Breakdown, ModelFacts
from autotune.backends._shell_text import printable


def _deepspeed() -> TrainingBackend:
    from autotune.backends.deepspeed import DeepSpeedBackend

    return DeepSpeedBackend()


def _fsdp2() -> TrainingBackend:
    from autotune.backends.fsdp2 import Fsdp2Backend

    return Fsdp2Backend()


# The built-in backends; each package is imported when its backend is first asked for.
register_backend("deepspeed", _deepspeed)
register_backend("fsdp2", _fsdp2)

__all__ = [
    "BACKENDS",
    "BACKEND_ROLES",
    "DEFAULT_BACKEND",
    "ActivationProfile",
    "BackendConfig",
    "BackendEngine",
    "BackendExportText",
    "BackendMemory",
    "BackendSupport",
    "Breakdown",
    "ModelFacts",
    "TrainingBackend",
    "cpu_rank_libraries",
    "get_backend",
    "prepare_rank_process",
    "printable",
    "register_backend",
]
