"""The rank side of a probe: one rank of a built-in workload (``python -m
autotune.probe.rank``) or of the user's script (``python -m autotune.probe.script_rank``),
the CPU fork launcher and loopback torchrun that start them, and the rank's memory.

Importing this package imports no torch: the tensor tracker, which needs torch to be
defined, is loaded when first asked for (PEP 562), so that a launcher's prelude and the
driver can name the package's light parts cheaply.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autotune.probe._rank_process import die_with_parent
from autotune.probe._timed_steps import PROGRESS_FILE
from autotune.probe.loopback_run import bound_listener

if TYPE_CHECKING:
    from autotune.probe._memtrack import TensorMemoryTracker

_LOADED_ON_USE = {"TensorMemoryTracker": "autotune.probe._memtrack"}

__all__ = [
    "PROGRESS_FILE",
    "TensorMemoryTracker",
    "bound_listener",
    "die_with_parent",
]


def __getattr__(name: str) -> Any:
    if name in _LOADED_ON_USE:
        return getattr(importlib.import_module(_LOADED_ON_USE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
