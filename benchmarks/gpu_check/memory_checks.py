"""The GPU check's memory checks: the memory model against the allocator, and precision and
offload, over the rows benchmarks/gpu_check/probes.py writes.

Pure functions over data, standard library only (the check's driver imports this before
anything is installed); tests/benchmarks/test_gpu_check.py feeds them recorded shapes,
tests/benchmarks/test_gpu_check_doctored.py doctored ones.
"""

from __future__ import annotations

import statistics
from typing import Any

from .report import MiB, check, mib, relative_error

# the memory model's targets against CUDA's allocated peak (reserved is reported), and
# against the CPU ranks' tracked bytes, which the model predicts as exactly
MEMORY_TARGET_MEDIAN = 0.03
MEMORY_TARGET_WORST = 0.08
# what a candidate may find allocated at its start on CUDA (the probe's own smallest leak
# tolerance; cuBLAS workspaces kept from an earlier candidate stay under it), and the live
# tensors on CPU ranks, where nothing but an earlier candidate's tensors can be left
LEAK_JUDGED_BYTES = {"cuda": 64 * MiB, "cpu": 1 * MiB}
# the probes' limit over the largest prediction of the candidates they run: room for the
# memory outside the allocator and the caching allocator's rounding, while a peak far
# above its prediction runs out of memory or shows over the limit (a card's whole memory
# would hide it)
LIMIT_OVER_PREDICTION = 1.3


def limit_over_predictions(predicted_bytes: list[int]) -> int:
    """The limit per rank the memory, NVMe and FSDP2 probes run under."""
    if not predicted_bytes or max(predicted_bytes) <= 0:
        raise ValueError("no prediction to set the probes' limit from")
    return int(LIMIT_OVER_PREDICTION * max(predicted_bytes))


def error_summary(errors: list[float]) -> dict[str, Any]:
    """Median and worst |error| and the worst under-prediction of relative errors."""
    if not errors:
        return {"n": 0, "median_abs": None, "worst_abs": None, "worst_under": None}
    absolute = [abs(e) for e in errors]
    return {
        "n": len(errors),
        "median_abs": statistics.median(absolute),
        "worst_abs": max(absolute),
        "worst_under": max([-e for e in errors if e < 0], default=0.0),
    }


def memory_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Errors of the prediction against the allocated and the reserved peak, over the
    design's candidates (the offload extras are reported apart)."""
    measured = [r for r in rows if r.get("design") and r.get("status") == "ok"]
    allocated = [
        e
        for r in measured
        if (e := relative_error(r["predicted_bytes"], r["allocated_bytes"])) is not None
    ]
    reserved = [
        e
        for r in measured
        if r.get("reserved_bytes")
        and (e := relative_error(r["predicted_bytes"], r["reserved_bytes"])) is not None
    ]
    return {"allocated": error_summary(allocated), "reserved": error_summary(reserved)}


def memory_checks(
    rows: list[dict[str, Any]], accelerator: str, min_candidates: int
) -> list[dict[str, Any]]:
    """The memory model against the allocator over the design's candidates (CUDA's
    allocated peak, or the CPU ranks' tracked bytes), every candidate within its limit, no
    leak. The error against the reserved peak is reported beside (:func:`memory_summary`)."""
    design = [r for r in rows if r.get("design")]
    failed = [f"{r['label']}: {r['status']} {r.get('error', '')[:120]}" for r in design]
    failed = [line for line, r in zip(failed, design, strict=True) if r["status"] != "ok"]
    summary = memory_summary(rows)
    n = summary["allocated"]["n"]
    checks = [
        check(
            f"at least {min_candidates} design candidates measured",
            n >= min_candidates,
            f"{n} of {len(design)} measured",
        ),
        check("every design candidate ran", bool(design) and not failed, "; ".join(failed)),
    ]
    alloc = summary["allocated"]
    on_cuda = accelerator == "cuda"
    against = "" if on_cuda else " (CPU ranks' tracked bytes)"
    if alloc["n"]:
        worst = max(
            (r for r in rows if r.get("design") and r.get("status") == "ok"),
            key=lambda r: abs(relative_error(r["predicted_bytes"], r["allocated_bytes"]) or 0),
        )
        checks.append(
            check(
                f"median |error| vs allocated <= {MEMORY_TARGET_MEDIAN:.0%}",
                alloc["median_abs"] <= MEMORY_TARGET_MEDIAN,
                f"{100 * alloc['median_abs']:.2f}%{against}",
            )
        )
        checks.append(
            check(
                f"worst |error| vs allocated <= {MEMORY_TARGET_WORST:.0%}",
                alloc["worst_abs"] <= MEMORY_TARGET_WORST,
                f"{100 * alloc['worst_abs']:.2f}% ({worst['label']}: "
                f"{mib(worst['predicted_bytes'])} MiB predicted, "
                f"{mib(worst['allocated_bytes'])} measured){against}",
            )
        )
    checks.append(_within_limit_check(rows, on_cuda))
    checks.append(_leak_check(rows, accelerator))
    return checks


def _device_peak_bytes(row: dict[str, Any], on_cuda: bool) -> int:
    """What the device had to provide: on CUDA the reserved peak with the memory outside
    the allocator (context, NCCL, cuBLAS) measured at the candidate's start and end; on CPU
    the tracked tensor peak."""
    if on_cuda:
        return int(row.get("reserved_bytes") or 0) + int(row.get("overhead_bytes") or 0)
    return int(row.get("allocated_bytes") or 0)


def _within_limit_check(rows: list[dict[str, Any]], on_cuda: bool) -> dict[str, Any]:
    """Every measured candidate's device peak stays within the limit it ran under: memory
    outside the allocator that grew after the limit was set (NCCL connecting later, a
    workspace made lazily) would put a candidate over it, as a card of that size would
    have run out."""
    measured = [r for r in rows if r.get("status") == "ok"]
    over = [
        f"{r['label']}: {mib(_device_peak_bytes(r, on_cuda))} MiB over "
        f"{mib(r.get('vram_limit_bytes'))} MiB"
        for r in measured
        if not r.get("vram_limit_bytes") or _device_peak_bytes(r, on_cuda) > r["vram_limit_bytes"]
    ]
    worst = max(
        (
            _device_peak_bytes(r, on_cuda) / r["vram_limit_bytes"]
            for r in measured
            if r.get("vram_limit_bytes")
        ),
        default=0.0,
    )
    return check(
        "every candidate's peak stays within the limit it ran under",
        bool(measured) and not over,
        "; ".join(over)
        or f"{len(measured)} candidates, the highest at {100 * worst:.1f}% of its limit",
    )


def _leak_check(rows: list[dict[str, Any]], accelerator: str) -> dict[str, Any]:
    """Each candidate of a warm launch starts with nothing an earlier one left allocated
    (the probe's ``leaked_bytes``: CUDA's allocated bytes, or the CPU ranks' live tensors;
    below the probe's leak tolerance the rank goes on, and what is left counts in the next
    peak), within :data:`LEAK_JUDGED_BYTES`."""
    leaks = [
        f"{r['label']}: {mib(r['leaked_bytes'])} MiB"
        for r in rows
        if r.get("status") == "ok" and (r.get("leaked_bytes") or 0) > 0
    ]
    worst = max((r.get("leaked_bytes") or 0 for r in rows), default=0)
    tolerance = LEAK_JUDGED_BYTES["cuda" if accelerator == "cuda" else "cpu"]
    return check(
        "no candidate starts with memory an earlier one left allocated",
        worst <= tolerance,
        ("; ".join(leaks) or "none") + f" (at most {mib(tolerance)} MiB)",
    )
