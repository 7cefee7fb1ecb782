"""When a probe has warmed up, when it has timed enough, and when it is clearly too slow.

Pure decisions over the step times measured so far; every rank sees the same times (the
slowest rank's, agreed by an all-reduce each step), so every rank decides the same and no
rank is left waiting in a collective.

- Warm-up ends after ``min_steps`` once two consecutive steps agree within
  :data:`SETTLE_TOLERANCE` (first steps pay allocator growth, lazy inits, caches), or at
  ``max_steps``.
- Timing ends after ``min_steps`` once the 95% confidence interval of the mean step time is
  within ``target`` of the mean (Student's t), or at ``max_steps`` / ``max_s``.
- A probe is clearly slower than ``threshold`` samples/s when even the fast end of its
  interval is below it: it can stop early (the search records it COMPLETE, stopped early,
  with what it measured).
- fp16: a step the dynamic loss scaler skips (gradient overflow: no optimizer update) is
  faster than a real one. Warm-up goes on while steps are skipped (the scale is still
  searching), skipped steps never count as settled or timed, and at most
  :data:`MAX_SKIPPED_STEPS` of them are run in each phase.
"""

from __future__ import annotations

import math
import statistics

SETTLE_TOLERANCE = 0.10
MIN_STEPS_FOR_STOP = 3
# fp16 overflow skips a phase may run before it stops waiting for the loss scale: from
# DeepSpeed's initial 2**16 a scale that still overflows after 16 halvings is broken.
MAX_SKIPPED_STEPS = 16

# Two-sided 95% quantiles of Student's t by degrees of freedom (1..30), then the normal's.
_T95 = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
]  # fmt: skip


def t95(degrees_of_freedom: int) -> float:
    if degrees_of_freedom < 1:
        return math.inf
    return _T95[degrees_of_freedom - 1] if degrees_of_freedom <= len(_T95) else 1.96


def mean_interval(times_s: list[float]) -> tuple[float, float]:
    """Mean step time and the half-width of its 95% confidence interval."""
    mean = statistics.fmean(times_s)
    if len(times_s) < 2:
        return mean, math.inf
    return mean, t95(len(times_s) - 1) * statistics.stdev(times_s) / math.sqrt(len(times_s))


def relative_half_width(times_s: list[float]) -> float:
    mean, half = mean_interval(times_s)
    return half / mean if mean > 0 else math.inf


def warmed_up(times_s: list[float], min_steps: int, max_steps: int) -> bool:
    if len(times_s) >= max_steps:
        return True
    if len(times_s) < max(min_steps, 2):
        return False
    previous, last = times_s[-2], times_s[-1]
    return abs(last - previous) <= SETTLE_TOLERANCE * max(previous, last)


def warmup_done(times_s: list[float], skipped: list[bool], min_steps: int, max_steps: int) -> bool:
    """:func:`warmed_up` over the steps the loss scaler did not skip; never right after a
    skipped step, unless :data:`MAX_SKIPPED_STEPS` were skipped already."""
    kept = [t for t, s in zip(times_s, skipped, strict=True) if not s]
    if len(times_s) - len(kept) >= MAX_SKIPPED_STEPS:
        return True
    if skipped and skipped[-1]:
        return False
    return warmed_up(kept, min_steps, max_steps)


def timing_done(
    times_s: list[float],
    skipped: int,
    *,
    min_steps: int,
    max_steps: int,
    target: float,
    max_s: float,
) -> bool:
    """:func:`timed_enough` over the timed (not skipped) steps; or ``skipped`` reached
    :data:`MAX_SKIPPED_STEPS`."""
    if skipped >= MAX_SKIPPED_STEPS:
        return True
    return timed_enough(
        times_s, min_steps=min_steps, max_steps=max_steps, target=target, max_s=max_s
    )


def timed_enough(
    times_s: list[float], *, min_steps: int, max_steps: int, target: float, max_s: float
) -> bool:
    if len(times_s) >= max_steps or sum(times_s) >= max_s:
        return len(times_s) >= 1
    if len(times_s) < min_steps:
        return False
    return relative_half_width(times_s) <= target


def clearly_slower(times_s: list[float], samples_per_step: int, threshold: float) -> bool:
    """Even the fast end of the 95% interval is below ``threshold`` samples/s."""
    if threshold <= 0 or len(times_s) < MIN_STEPS_FOR_STOP:
        return False
    mean, half = mean_interval(times_s)
    fastest_time = max(mean - half, 1e-9)
    return samples_per_step / fastest_time < threshold
