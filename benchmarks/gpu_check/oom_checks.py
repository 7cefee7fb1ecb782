"""The GPU check's out-of-memory checks: a limit between two candidate families, and what a
study under it must show (the probe recorded oom, the study going on, larger micro-batches
ruled out, nothing left behind), over the `autotune plan --json` and `autotune status
--json` documents and the probes' rank reports.

Pure functions over data, standard library only (the check's driver imports this before
anything is installed); tests/benchmarks/test_gpu_check.py feeds them recorded shapes,
tests/benchmarks/test_gpu_check_doctored.py doctored ones.
"""

from __future__ import annotations

from typing import Any

from .report import MiB, check, mib

# how far the CUDA overhead (context, NCCL, cuBLAS) of the probe after an out-of-memory may
# lie from the one before it before memory left behind by the failed probe is suspected
ZOMBIE_TOLERANCE_BYTES = 256 * MiB
# the parts of a candidate that are not its micro-batch: a "family" in micro-batch order
FAMILY_KEYS = (
    "precision",
    "zero_stage",
    "offload_optimizer",
    "offload_optimizer_ratio",
    "offload_param",
    "activation_checkpointing",
)


def family(candidate: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(candidate.get(key) for key in FAMILY_KEYS)


def oom_limit(plan: dict[str, Any], overhead_bytes: int) -> dict[str, Any]:
    """A limit halfway between the smallest family's need and the next one's (each at its
    smallest micro-batch, as the memory model predicts), plus what lies outside the
    allocator on CUDA: the smallest family fits, the others run out of memory."""
    need: dict[tuple[Any, ...], tuple[int, str]] = {}
    for entry in plan["candidates"]:
        key = family(entry["candidate"])
        if entry.get("device_bytes") is None:
            continue
        if key not in need or entry["device_bytes"] < need[key][0]:
            need[key] = (int(entry["device_bytes"]), entry["label"])
    ranked = sorted(need.items(), key=lambda item: item[1][0])
    if len(ranked) < 2:
        raise ValueError("the out-of-memory space needs two candidate families")
    (small_key, (small, small_label)), (_, (large, large_label)) = ranked[0], ranked[1]
    if large < 1.25 * small:
        raise ValueError(
            f"no clear gap between {small_label} ({mib(small)} MiB predicted) and "
            f"{large_label} ({mib(large)} MiB): no limit separates them"
        )
    return {
        "limit_bytes": int((small + large) / 2 + overhead_bytes),
        "fits": small_label,
        "fits_family": list(small_key),
        "fits_predicted_bytes": small,
        "runs_out": large_label,
        "runs_out_predicted_bytes": large,
        "overhead_bytes": overhead_bytes,
    }


def _probed(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in trials if t.get("status") in ("ok", "oom")]


def oom_checks(
    status: dict[str, Any],
    plan: dict[str, Any],
    reports: dict[int, dict[str, Any]],
    *,
    accelerator: str,
    exit_code: int,
    leftovers: list[str],
    limit_bytes: int,
    baseline_overhead_bytes: int | None = None,
) -> list[dict[str, Any]]:
    """The study under a limit below need: an out-of-memory probe is ``oom``, the study goes
    on, larger micro-batches of that family are not probed, the next probe starts clean
    (``baseline_overhead_bytes``: the memory outside the allocator of clean probes on this
    GPU, the memory phase's), and the probes that fit stayed within the limit."""
    trials = sorted(status.get("trials", []), key=lambda t: t["number"])
    ooms = [t for t in trials if t.get("status") == "oom"]
    checks: list[dict[str, Any]] = []
    cuda_text = [t for t in ooms if "CUDA out of memory" in (t.get("error") or "")]
    detail = "; ".join(
        f"trial {t['number']} {t['label']}: {t.get('error', '')[:160]}" for t in ooms
    )
    checks.append(
        check(
            "a probe over the limit is recorded oom"
            + (" with CUDA's message" if accelerator == "cuda" else ""),
            bool(cuda_text) if accelerator == "cuda" else bool(ooms),
            detail or "no trial ended oom",
        )
    )
    if not ooms:
        return checks
    first = ooms[0]["number"]
    after = [t for t in _probed(trials) if t["number"] > first]
    checks.append(
        check(
            "the study went on after the out-of-memory and exported a fitting config",
            bool(after) and exit_code == 0,
            f"{len(after)} probe(s) after trial {first}; run exit code {exit_code}",
        )
    )
    checks += _ruled_out_checks(trials, ooms, plan)
    checks.append(
        _zombie_check(trials, ooms, reports, accelerator, leftovers, baseline_overhead_bytes)
    )
    checks.append(_fitting_probes_check(trials, reports, accelerator, limit_bytes))
    return checks


def _fitting_probes_check(
    trials: list[dict[str, Any]],
    reports: dict[int, dict[str, Any]],
    accelerator: str,
    limit_bytes: int,
) -> dict[str, Any]:
    """Each probe that fit (``ok``) reached at most the limit on the device: its reserved
    peak with the memory outside the allocator, as its rank reported them. Memory outside
    the allocator that grew after the limit was set (NCCL connecting later, cuBLAS
    workspaces) would put it over, as a card of that size would have run out. Judged on
    CUDA; CPU ranks' tracker enforces the limit itself."""
    name = "the probes that fit stayed within the limit (reserved peak with the overhead)"
    ok = [t["number"] for t in trials if t.get("status") == "ok"]
    if accelerator != "cuda":
        return check(name, None, "CPU ranks: the tensor tracker enforces the limit itself")
    if not ok:
        return check(name, False, "no probe fit under the limit")
    peaks = {n: int((reports.get(n) or {}).get("peak_reserved_bytes") or 0) for n in ok}
    over = [f"trial {n}: {mib(p)} MiB" for n, p in peaks.items() if not p or p > limit_bytes]
    seen = ", ".join(f"trial {n}: {mib(p)} MiB" for n, p in peaks.items())
    return check(
        name,
        not over,
        f"limit {mib(limit_bytes)} MiB; "
        + ("over it or not reported: " + "; ".join(over) if over else seen),
    )


def _ruled_out_checks(
    trials: list[dict[str, Any]], ooms: list[dict[str, Any]], plan: dict[str, Any]
) -> list[dict[str, Any]]:
    """After an out-of-memory at micro-batch m, no larger one of that family is probed: it
    is recorded infeasible without a probe when proposed, or never proposed."""
    probed_later, ruled_out = [], []
    probed = {(family(t["candidate"]), t["candidate"]["micro_batch_size"]) for t in _probed(trials)}
    for oom in ooms:
        key, size = family(oom["candidate"]), oom["candidate"]["micro_batch_size"]
        probed_later += [
            f"trial {t['number']} {t['label']}"
            for t in _probed(trials)
            if t["number"] > oom["number"]
            and family(t["candidate"]) == key
            and t["candidate"]["micro_batch_size"] > size
        ]
        ruled_out += [
            entry["label"]
            for entry in plan["candidates"]
            if family(entry["candidate"]) == key
            and entry["candidate"]["micro_batch_size"] > size
            and (key, entry["candidate"]["micro_batch_size"]) not in probed
        ]
    recorded = [
        t["label"]
        for t in trials
        if t.get("status") == "pruned" and "oom at micro-batch" in (t.get("pruned_by") or "")
    ]
    detail = ", ".join(sorted(set(ruled_out)))
    if recorded:
        detail += f" (recorded infeasible without a probe: {', '.join(recorded)})"
    return [
        check(
            "no larger micro-batch of an out-of-memory family probed after it",
            not probed_later,
            "; ".join(probed_later),
        ),
        check(
            "larger micro-batches ruled out without a probe",
            bool(ruled_out),
            detail or "none: every out-of-memory was at a family's largest micro-batch",
        ),
    ]


def _zombie_check(
    trials: list[dict[str, Any]],
    ooms: list[dict[str, Any]],
    reports: dict[int, dict[str, Any]],
    accelerator: str,
    leftovers: list[str],
    baseline_overhead_bytes: int | None,
) -> dict[str, Any]:
    """The probe after each out-of-memory starts with nothing left allocated, and on CUDA
    sees no more memory outside its allocator than clean probes on the same GPU did (the
    memory phase's, and the study's before its first out-of-memory): a process still
    holding the failed probe's memory would add to it."""
    probed = _probed(trials)
    before = [
        int(reports.get(t["number"], {}).get("device_overhead_bytes") or 0)
        for t in probed
        if t["number"] < ooms[0]["number"] and t["status"] == "ok"
    ]
    clean = [b for b in [*before, baseline_overhead_bytes or 0] if b > 0]
    baseline = min(clean) if clean else None
    problems, seen = [], []
    for oom in ooms:
        nxt = next((t for t in probed if t["number"] > oom["number"]), None)
        if nxt is None:
            continue
        if nxt["number"] not in reports:
            problems.append(f"trial {nxt['number']}: no rank report to read")
            continue
        report = reports[nxt["number"]]
        leaked = int(report.get("leaked_bytes") or 0)
        # measured once the probe ran its steps: an out-of-memory probe has none
        overhead = int(report.get("device_overhead_bytes") or 0) if nxt["status"] == "ok" else 0
        seen.append(
            f"trial {nxt['number']}: leaked {mib(leaked)} MiB, overhead {mib(overhead)} MiB"
        )
        if leaked:
            problems.append(f"trial {nxt['number']} started with {mib(leaked)} MiB allocated")
        if accelerator == "cuda" and baseline and overhead - baseline > ZOMBIE_TOLERANCE_BYTES:
            problems.append(
                f"trial {nxt['number']} saw {mib(overhead - baseline)} MiB more outside its "
                f"allocator than clean probes ({mib(baseline)} MiB)"
            )
    problems += [f"process left running: {line}" for line in leftovers]
    return check(
        "no memory or process left behind by the out-of-memory probe",
        not problems if seen or problems else None,
        "; ".join(problems or seen) or "no probe ran after the out-of-memory",
    )
