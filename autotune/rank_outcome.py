"""How the ranks' reports of one probe fold into its :class:`~autotune.protocol.ProbeResult`
(the worst rank decides the status, a missing report is a crash), and the root cause of a
failed launch read from the launcher's log."""

from __future__ import annotations

import re
import statistics
from typing import Any

from autotune.measurement import HostPeakMethod
from autotune.protocol import ProbeResult, ProbeSpec, RankReport

# Least exact first: a sample may miss a short peak; the end of a probe is not its peak.
_LEAST_EXACT_FIRST: tuple[HostPeakMethod, ...] = ("at_end", "sampled", "kernel_hwm")


def _least_exact(methods: list[HostPeakMethod]) -> HostPeakMethod:
    """The method that qualifies every rank's peak (no rank: ``at_end``)."""
    return next((m for m in _LEAST_EXACT_FIRST if m in methods), "at_end")


def aggregate(
    spec: ProbeSpec,
    reports: list[RankReport],
    *,
    world_size: int,
    exit_code: int | None,
    timed_out: bool,
    wall_s: float,
    log_tail: str,
) -> ProbeResult:
    """Fold the ranks' reports into one result; the worst rank decides the status."""
    reports = sorted(reports, key=lambda r: r.rank)
    common: dict[str, Any] = {
        "peak_bytes_per_rank": [r.peak_allocated_bytes for r in reports],
        "reserved_bytes_per_rank": [r.peak_reserved_bytes for r in reports],
        "host_peak_bytes_per_rank": [r.host_peak_bytes for r in reports],
        "host_peak_method": _least_exact([r.host_peak_method for r in reports]),
        "node_per_rank": [r.node for r in reports],
        "wall_s": wall_s,
        "init_s": max((r.init_s for r in reports), default=0.0),
        "threads_per_rank": max((r.threads for r in reports), default=0),
        "exit_code": exit_code,
        "log_tail": log_tail,
        "versions": reports[0].versions if reports else {},
        "warmup_steps": max((len(r.warmup_step_times_s) for r in reports), default=0),
        "stopped_early": any(r.stopped_early for r in reports),
        "skipped_steps": max((r.skipped_steps for r in reports), default=0),
        "overhead_bytes_per_rank": [r.device_overhead_bytes for r in reports],
        "model": next((r.model for r in reports if r.model is not None), None),
        "activation_bytes": max((r.activation_bytes for r in reports), default=0),
    }
    oom = [r for r in reports if r.status == "oom"]
    # An unclean start probed nothing; its launcher normally restarts the group instead.
    errors = [r for r in reports if r.status in ("error", "unclean")]
    if oom:
        return ProbeResult(status="oom", error=f"rank {oom[0].rank}: {oom[0].error}", **common)
    if timed_out:
        return ProbeResult(
            status="timeout",
            error=f"probe did not finish within its timeout ({wall_s:.0f} s); killed",
            **common,
        )
    missing = sorted(set(range(world_size)) - {r.rank for r in reports})
    if errors and not missing:
        return ProbeResult(
            status="error", error=f"rank {errors[0].rank}: {errors[0].error}", **common
        )
    if missing or exit_code not in (0, None):
        error = _crash_error(exit_code, missing, errors, log_tail)
        return ProbeResult(status="error", error=error, **common)
    if spec.loss_run is not None:  # the ranks agree on every value (all-reduced)
        return ProbeResult(status="ok", loss_trace=reports[0].loss_trace, **common)
    return _measured(spec, reports, common)


def _crash_error(
    exit_code: int | None, missing: list[int], errors: list[RankReport], log_tail: str
) -> str:
    """Why a launch failed whose ranks did not all report (or torchrun exited non-zero)."""
    # A rank that wrote no report died first (a crash, a kill); the errors of the others
    # (a broken connection) are consequences, named after it.
    cause = torchrun_root_cause(log_tail, missing) or ("" if errors else _last_line(log_tail))
    parts = [f"probe exited with code {exit_code}"]
    if missing:
        parts.append(f"rank(s) {missing} wrote no report")
    if cause:
        parts.append(cause)
    if errors:
        parts.append(f"then rank {errors[0].rank}: {errors[0].error}")
    return "; ".join(parts)[:1000]


def _measured(spec: ProbeSpec, reports: list[RankReport], common: dict[str, Any]) -> ProbeResult:
    """The throughput of a probe every rank finished."""
    # Ranks step in lockstep (collectives); the slowest rank's time is the step's time.
    step_times = [max(times) for times in zip(*(r.step_times_s for r in reports), strict=True)]
    median_step = statistics.median(step_times)
    batch = spec.candidate.train_batch_size
    return ProbeResult(
        status="ok",
        samples_per_s=batch / median_step,
        samples_per_s_min=batch / max(step_times),
        samples_per_s_max=batch / min(step_times),
        tokens_per_s=batch * spec.tokens_per_sample / median_step,
        step_time_s=median_step,
        step_times_s=step_times,
        timed_s=sum(step_times),
        **common,
    )


# One entry of torchrun's failure report ("Failures:" and "Root Cause (first observed
# failure):" blocks of torch.distributed.elastic): rank, exit code, traceback line.
_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)[^\n]*\n\s*exitcode\s*:\s*(?P<code>-?\d+)[^\n]*"
    r"(?:\n\s*error_file[^\n]*)?(?:\n\s*traceback\s*:\s*(?P<trace>[^\n]*))?"
)


SIGTERM_EXIT = -15  # how the launcher ends the surviving ranks once one has failed


def torchrun_root_cause(log: str, missing: list[int] | None = None) -> str:
    """The rank that died first, as one line, from torchrun's failure report.

    torchrun's "Root Cause" is the first failure it *observed*: when a rank is killed, its
    peer may fail on the broken connection and be polled first, or be stopped by torchrun
    itself (SIGTERM). So a rank that wrote no report (in ``missing``) and was not stopped by
    torchrun is the cause; then torchrun's root cause; SIGTERMed ranks come last.
    """
    entries = list(_FAILURE.finditer(log))
    if not entries:
        return ""
    root = log.find("Root Cause")
    after_root = [m for m in entries if root >= 0 and m.start() > root]
    by_rank = {int(m.group("rank")): m for m in entries}
    ordered = [by_rank[r] for r in missing or [] if r in by_rank] + after_root + entries
    chosen = next((m for m in ordered if int(m.group("code")) != SIGTERM_EXIT), ordered[0])
    trace = (chosen.group("trace") or "").strip()
    text = f"rank {chosen.group('rank')} died first with exit code {chosen.group('code')}"
    if trace and trace != "<N/A>" and "To enable traceback" not in trace:
        text += f" ({trace})"
    return text


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
