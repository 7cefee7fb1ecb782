"""The GPU check's memory checks: the memory model against the allocator, and precision and
offload, over the rows benchmarks/gpu_check/probes.py writes.

Pure functions over data, standard library only (the check's driver imports this before
anything is installed); tests/benchmarks/test_gpu_check.py feeds them recorded shapes.
"""

from __future__ import annotations

import statistics
from typing import Any

from .report import MiB, check, mib, relative_error

# the memory model's targets against CUDA's allocated peak; reserved is reported
MEMORY_TARGET_MEDIAN = 0.03
MEMORY_TARGET_WORST = 0.08
# what a candidate may find allocated at its start on CUDA (the probe's own smallest leak
# tolerance; cuBLAS workspaces kept from an earlier candidate stay under it)
LEAK_JUDGED_BYTES = 64 * MiB


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
        check("every design candidate ran", not failed, "; ".join(failed)),
    ]
    alloc, res = summary["allocated"], summary["reserved"]
    on_cuda = accelerator == "cuda"
    if alloc["n"]:
        checks.append(
            check(
                f"median |error| vs allocated <= {MEMORY_TARGET_MEDIAN:.0%}",
                alloc["median_abs"] <= MEMORY_TARGET_MEDIAN if on_cuda else None,
                f"{100 * alloc['median_abs']:.2f}%"
                + ("" if on_cuda else " (CPU tracked bytes: the target applies on CUDA)"),
            )
        )
        checks.append(
            check(
                f"worst |error| vs allocated <= {MEMORY_TARGET_WORST:.0%}",
                alloc["worst_abs"] <= MEMORY_TARGET_WORST if on_cuda else None,
                f"{100 * alloc['worst_abs']:.2f}%",
            )
        )
    if res["n"]:
        checks.append(
            check(
                "error vs reserved (reported beside allocated)",
                None,
                f"median {100 * res['median_abs']:.2f}%, worst {100 * res['worst_abs']:.2f}%",
            )
        )
    checks.append(leak_check(rows, on_cuda))
    return checks


def leak_check(rows: list[dict[str, Any]], on_cuda: bool) -> dict[str, Any]:
    """Each candidate of a warm launch starts with nothing an earlier one left allocated
    (the probe's ``leaked_bytes``; below the leak tolerance the rank goes on, and what is
    left counts in the next peak). Judged on CUDA; on CPU ranks reported."""
    leaks = [
        f"{r['label']}: {mib(r['leaked_bytes'])} MiB"
        for r in rows
        if r.get("status") == "ok" and (r.get("leaked_bytes") or 0) > 0
    ]
    worst = max((r.get("leaked_bytes") or 0 for r in rows), default=0)
    return check(
        "no candidate starts with memory an earlier one left allocated",
        worst <= LEAK_JUDGED_BYTES if on_cuda else None,
        "; ".join(leaks) or "none",
    )


def precision_offload_checks(
    rows: list[dict[str, Any]], accelerator: str, nvme_skip_reason: str
) -> list[dict[str, Any]]:
    """fp16 with a dynamic loss scale, bf16, optimizer offload to pinned CPU memory, NVMe."""

    def outcome(selected: list[dict[str, Any]]) -> tuple[bool | None, str]:
        if not selected:
            return None, "no such candidate in this run"
        bad = [f"{r['label']}: {r['status']} {r.get('error', '')[:120]}" for r in selected]
        bad = [b for b, r in zip(bad, selected, strict=True) if r["status"] != "ok"]
        return not bad, "; ".join(bad) or f"{len(selected)} ran"

    checks = []
    fp16 = [r for r in rows if r["precision"] == "fp16"]
    ok, detail = outcome(fp16)
    if fp16:
        dynamic = all(r.get("loss_scale") == 0 for r in fp16)
        skipped = sum(r.get("skipped_steps", 0) for r in fp16)
        ok = bool(ok and dynamic)
        detail += f"; dynamic loss scale: {dynamic}; overflow-skipped steps: {skipped}"
    elif accelerator == "cpu":
        detail = "fp16 is refused by DeepSpeed's CPU accelerator here (needs CUDA)"
    checks.append(check("fp16 (dynamic loss scale) runs", ok, detail))
    checks.append(check("bf16 runs", *outcome([r for r in rows if r["precision"] == "bf16"])))
    cpu = [r for r in rows if "cpu" in (r["offload_optimizer"], r["offload_param"])]
    ok, detail = outcome(cpu)
    if cpu:
        pinned = all(r.get("pin_memory") for r in cpu)
        ok = bool(ok and pinned)
        starts = [r.get("pinned_host_bytes_at_start", 0) for r in cpu]
        detail += f"; pinned: {pinned}; pinned host bytes at each start: {starts}"
    checks.append(check("optimizer offload to CPU (pinned) runs", ok, detail))
    nvme = [r for r in rows if "nvme" in (r["offload_optimizer"], r["offload_param"])]
    ok, detail = outcome(nvme)
    checks.append(check("NVMe offload runs", ok, detail if nvme else nvme_skip_reason))
    return checks
