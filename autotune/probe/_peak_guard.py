"""A candidate's peak counters, kept from DeepSpeed's resets.

DeepSpeed resets the accelerator's peak counters inside ``initialize``, through
``get_accelerator().reset_peak_memory_stats()`` (``deepspeed/runtime/utils.py``):
``empty_cache()`` does it on every rank, and ZeRO-1/2's optimizer calls it while it flattens
each parameter group (``runtime/zero/stage_1_and_2.py``); ``see_memory_usage(message,
force=True)`` does it on rank 0, forced in DeepSpeed 0.19 by the bf16 optimizer
(``runtime/bf16_optimizer.py``: ZeRO-1 in bf16 with ``data_types.grad_accum_dtype`` fp32 and
no offload), by the engine's ``memory_breakdown`` option (before and after every forward,
backward and step), and before DeepSpeed 0.18.8 by the ZeRO stages too. On CUDA a reset
makes ``max_memory_allocated``/``max_memory_reserved`` forget what came before it: a rank
would lose the model build and ``initialize``'s transients from its peak, and a script probe
its "peak from the rank's start". While :func:`peak_counters_kept` holds (a candidate's
length: build, initialize, steps), the accelerator's ``reset_peak_memory_stats`` does
nothing; the probe resets torch's counters itself, where a candidate starts.

Heavy imports (DeepSpeed) stay inside functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

_PATCHED = "reset_peak_memory_stats"


def _keep_peaks(device_index: Any = None) -> None:
    """The accelerator's ``reset_peak_memory_stats`` while a candidate runs: nothing."""


@contextlib.contextmanager
def peak_counters_kept() -> Iterator[None]:
    """DeepSpeed's accelerator cannot reset the peak memory counters inside this block; its
    own method is back afterwards (the block is re-entrant)."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    shadowed = accelerator.__dict__.get(_PATCHED)  # an instance attribute already there
    accelerator.reset_peak_memory_stats = _keep_peaks
    try:
        yield
    finally:
        if shadowed is None:
            del accelerator.reset_peak_memory_stats  # the class's method again
        else:
            accelerator.reset_peak_memory_stats = shadowed
