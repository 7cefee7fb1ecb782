"""What a script probe's failure means, in one line the user can act on.

The ranks of a script probe (:mod:`autotune.probe.script_rank`) report what they saw; what they
could not see (the script hung before ``deepspeed.initialize``, a rank died without a
report, the script printed its own error and exited) is read here, on the driver, from the
trial folder and the end of the probe's log.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.protocol import INITIALIZED_MARKER

if TYPE_CHECKING:
    from autotune.execution.launch import ProbeJob
    from autotune.protocol import ProbeResult

# Lines of torchrun's and Python's own output that say nothing about the script's failure.
_NOISE = re.compile(
    r"^(\*+|=+|-+|Traceback|\s*\^+|.*Warning|.*warnings\.warn|.*torch\.distributed\.elastic|"
    r"Root Cause|Failures:|\[\d+\]:|\s*(time|host|rank|exitcode|error_file|traceback)\s*:|"
    r"To enable traceback|.*elastic/errors\.html|.*FAILED\s*$|\s*File \"|\s+\S)"
)
_RANK_PREFIX = re.compile(r"^\[(?:rank|RANK )\d+\]:\s?")
# What torch says when a process group asks for NCCL where there is none.
_NO_NCCL = re.compile(r"doesn't have NCCL built in|ProcessGroupNCCL is only supported with GPUs")
# torch's own log lines (glog style: E1201 15:55:35.762000 19737 file.py:1002] ...)
_GLOG = re.compile(r"^[EWIF]\d{4} \d\d:\d\d:\d\d")


def last_lines(log: str, count: int = 3) -> str:
    """The script's last distinct lines of output, joined by `` | `` (torchrun's report,
    warnings and traceback frames left out)."""
    kept: list[str] = []
    for raw in log.splitlines()[1:]:  # the tail's first line may be cut
        line = _RANK_PREFIX.sub("", raw).rstrip()
        if not line.strip() or _NOISE.match(line) or _GLOG.match(line):
            continue
        if line in kept:
            kept.remove(line)
        kept.append(line.strip())
    return " | ".join(text[:200] for text in kept[-count:])


def explain(job: ProbeJob, result: ProbeResult) -> ProbeResult:
    """``result`` with a failure explained for a script probe."""
    if result.status == "ok" or result.status == "oom":
        return result
    name = Path(job.spec.script.path).name if job.spec.script else "the script"
    trial_dir = Path(job.trial_dir)
    reached = any(trial_dir.glob(INITIALIZED_MARKER.format(rank="*")))
    tail = last_lines(result.log_tail)
    if result.status == "timeout":
        if not reached:
            error = (
                f"{name} did not call deepspeed.initialize within the probe timeout "
                f"({job.timeout_s:.0f} s); it may be loading data or waiting on something: "
                "raise --probe-timeout, or check that it starts"
            )
        else:
            error = (
                f"{name} did not finish the probe's optimizer steps within the probe timeout "
                f"({job.timeout_s:.0f} s); killed. Raise --probe-timeout if its steps are slow"
            )
        return result.model_copy(update={"error": _with_tail(error, tail)})
    error = result.error
    if " raised " in error and "then rank " in error:  # the peers' deaths are consequences
        error = "rank " + error.split("then rank ", 1)[1]
    if _NO_NCCL.search(result.log_tail + error) and job.spec.accelerator == "cpu":
        error = (
            f"{name} initialises torch.distributed with NCCL, which CPU ranks do not have: "
            "use backend 'gloo' on CPU (or deepspeed.init_distributed(), which picks it)"
        )
    elif " raised " not in error:  # the script's own exception already says where
        error = _with_tail(error, tail)
    return result.model_copy(update={"error": error[:1000]})


def _with_tail(error: str, tail: str) -> str:
    return f"{error}; its last lines: {tail}" if tail and tail not in error else error


def again_cold(warm: ProbeResult, probe_cold: Callable[[], ProbeResult]) -> ProbeResult:
    """A script's warm run (not its group's first) failed: ``probe_cold()`` probes it again
    in a fresh group. Where that one measures, the script cannot run twice in one process
    (its module-level state, a side effect), the result says so (``warm_fallback``) and the
    caller stops running the script warm; else the cold failure is the probe's."""
    cold = probe_cold()
    if cold.status == "ok":
        first = (warm.error or "").splitlines()[0][:200] if warm.error else warm.status
        cold.warm_fallback = (
            f"run again in warm ranks the script failed ({first}) where a cold launch "
            "measured: its probes are cold launches from here on"
        )
    return cold
