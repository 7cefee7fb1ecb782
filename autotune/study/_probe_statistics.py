"""The statistics of repeated probes of one candidate: its estimate with a 95% interval and
its spread between probes, a search trial's interval from its timed steps, and the F test
that tells a markedly steadier candidate (:mod:`autotune.study.confirmation`)."""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING

from autotune.timing import mean_interval, t95

if TYPE_CHECKING:
    from autotune.study.records import TrialView

# The sample median's standard error is sqrt(pi/2) ~ 1.2533 times the mean's for normally
# distributed data (Kenney and Keeping, "Mathematics of Statistics", 1962, sec. 13.13).
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)
# What a candidate's estimate is (estimate_of), in the words of the best's reason and
# summary.md: "<ESTIMATE_OF> its search probe and 3 interleaved re-probes"
ESTIMATE_OF = "the lower of the median and the mean of"
STEADIER_CONFIDENCE_Z = 1.645  # one-sided 95%


def estimate_of(samples_per_s: list[float]) -> tuple[float, float, float]:
    """The estimate of repeated probes, the half-width of its 95% interval (as of a
    median) and the spread between probes (standard deviation / estimate). The estimate is
    the lower of the median and the mean: a lucky probe cannot lift it above the other
    probes (the median), and a slow mode that some probes land in (CPU offload measures
    bimodal here) pulls it down, as it slows a production run, which pays the mean."""
    values = samples_per_s
    estimate = min(statistics.median(values), statistics.fmean(values)) if values else 0.0
    if len(values) < 2 or estimate <= 0:
        return estimate, 0.0, 0.0
    stdev = statistics.stdev(values)
    half_width = t95(len(values) - 1) * MEDIAN_SE_FACTOR * stdev / math.sqrt(len(values))
    return estimate, half_width, stdev / estimate


def f_quantile(d1: int, d2: int, z: float = STEADIER_CONFIDENCE_Z) -> float:
    """The F distribution's quantile for the normal quantile ``z``, by Paulson's cube-root
    approximation (Paulson, "An approximate normalization of the analysis of variance
    distribution", Ann. Math. Stat. 13, 1942; within 7% of the exact 95% quantile from 3
    degrees of freedom, on the conservative side)."""
    a, b = 2.0 / (9.0 * d1), 2.0 / (9.0 * d2)
    denominator = (1.0 - b) ** 2 - z * z * b
    if denominator <= 0:
        return math.inf
    root = math.sqrt(max((1.0 - a) ** 2 * b + (1.0 - b) ** 2 * a - z * z * a * b, 0.0))
    return (((1.0 - a) * (1.0 - b) + z * root) / denominator) ** 3


def step_interval(trial: TrialView) -> tuple[float, float]:
    """A search trial's samples/s and the half-width of its 95% interval, from its steps."""
    record = trial.record
    times = record.step_times_s
    rate = record.samples_per_s
    if len(times) < 2 or rate <= 0:
        return rate, rate * 0.1  # one step: assume the ±10% noise of this machine class
    mean, half = mean_interval(times)
    batch = rate * statistics.median(times)
    return batch / mean, batch / max(mean - half, 1e-9) - batch / mean
