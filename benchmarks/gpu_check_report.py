"""What the GPU check's phases showed: checks over their outputs, and the report.

Pure functions over data (the `autotune status --json` and `autotune plan --json`
documents, the rows benchmarks/gpu_check_probes.py writes, pytest's summary lines), so that
tests/test_gpu_check.py can feed them recorded shapes. Standard library only: the check's
driver imports this before anything is installed.

A check is ``{"name", "ok", "detail"}`` with ``ok`` True, False, or None (reported, not
judged: a target that applies on CUDA only, a step the order of a run did not reach).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable
from typing import Any

MiB = 2**20
GiB = 2**30
# the memory model against CUDA's allocated peak (issue's targets); reserved is reported
MEMORY_TARGET_MEDIAN = 0.03
MEMORY_TARGET_WORST = 0.08
# how far the CUDA overhead (context, NCCL, cuBLAS) of the probe after an out-of-memory may
# lie from the one before it before memory left behind by the failed probe is suspected
ZOMBIE_TOLERANCE_BYTES = 256 * MiB
# what a candidate may find allocated at its start on CUDA (the probe's own smallest leak
# tolerance; cuBLAS workspaces kept from an earlier candidate stay under it)
LEAK_JUDGED_BYTES = 64 * MiB
# the parts of a candidate that are not its micro-batch: a "family" in micro-batch order
FAMILY_KEYS = (
    "precision",
    "zero_stage",
    "offload_optimizer",
    "offload_optimizer_ratio",
    "offload_param",
    "activation_checkpointing",
)


def check(name: str, ok: bool | None, detail: str = "") -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail}


def mib(value: float | None) -> str:
    return "" if value is None else f"{value / MiB:.1f}"


def pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:+.1f}%"


def relative_error(predicted: float, measured: float) -> float | None:
    return (predicted - measured) / measured if measured else None


# ---------------------------------------------------------------- memory model vs allocator


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


# ---------------------------------------------------------------- out of memory


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
) -> list[dict[str, Any]]:
    """The study under a limit below need: an out-of-memory probe is ``oom``, the study goes
    on, larger micro-batches of that family are not probed, the next probe starts clean."""
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
    checks.append(_zombie_check(trials, ooms, reports, accelerator, leftovers))
    return checks


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
) -> dict[str, Any]:
    """The probe after each out-of-memory starts with nothing left allocated, and on CUDA
    sees the same memory outside its allocator as the probes before (a process still
    holding the failed probe's memory would add to it)."""
    probed = _probed(trials)
    before = [
        reports.get(t["number"], {}).get("device_overhead_bytes", 0)
        for t in probed
        if t["number"] < ooms[0]["number"] and t["status"] == "ok"
    ]
    problems, seen = [], []
    for oom in ooms:
        nxt = next((t for t in probed if t["number"] > oom["number"]), None)
        if nxt is None:
            continue
        report = reports.get(nxt["number"], {})
        leaked = int(report.get("leaked_bytes", 0))
        overhead = int(report.get("device_overhead_bytes", 0))
        seen.append(
            f"trial {nxt['number']}: leaked {mib(leaked)} MiB, overhead {mib(overhead)} MiB"
        )
        if leaked:
            problems.append(f"trial {nxt['number']} started with {mib(leaked)} MiB allocated")
        baseline = min(before) if before else None
        if accelerator == "cuda" and baseline and overhead - baseline > ZOMBIE_TOLERANCE_BYTES:
            problems.append(
                f"trial {nxt['number']} saw {mib(overhead - baseline)} MiB more outside its "
                "allocator than the probes before the out-of-memory"
            )
    problems += [f"process left running: {line}" for line in leftovers]
    return check(
        "no memory or process left behind by the out-of-memory probe",
        not problems if seen or leftovers else None,
        "; ".join(problems or seen) or "no probe ran after the out-of-memory",
    )


# ---------------------------------------------------------------- studies and training


def study_summary(status: dict[str, Any]) -> dict[str, Any]:
    trials = status.get("trials", [])
    confirmation = status.get("confirmation") or {}
    return {
        "best": status.get("best"),
        "budget": status.get("budget"),
        "counts": status.get("counts"),
        "statuses": _count(t.get("status", "?") for t in trials),
        "contenders": [
            {
                "trial": c.get("trial"),
                "label": c.get("label"),
                "samples_per_s": c.get("samples_per_s", []),
                "estimate": c.get("estimate"),
                "half_width": c.get("half_width"),
            }
            for c in confirmation.get("contenders", [])
        ],
        "rounds": confirmation.get("rounds"),
        "trials": [
            {
                key: t.get(key)
                for key in (
                    "number",
                    "label",
                    "status",
                    "samples_per_s",
                    "peak_bytes",
                    "predicted_peak_bytes",
                    "probe_wall_s",
                    "pruned_by",
                    "error",
                )
            }
            for t in trials
        ],
    }


def _count(values: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def study_checks(
    status: dict[str, Any], exit_code: int, exported: bool, *, min_probes: int, confirm: bool
) -> list[dict[str, Any]]:
    trials = status.get("trials", [])
    ok = [t for t in trials if t.get("status") == "ok"]
    failed = [
        f"trial {t['number']} {t['label']}: {t['status']} {(t.get('error') or '')[:160]}"
        for t in trials
        if t.get("status") in ("error", "timeout")
    ]
    contenders = (status.get("confirmation") or {}).get("contenders", [])
    return [
        check(
            "the run exported a config (exit code 0)",
            exit_code == 0 and exported,
            f"exit code {exit_code}",
        ),
        check(f"at least {min_probes} probe(s) measured", len(ok) >= min_probes, f"{len(ok)} ok"),
        check("no probe failed (error, timeout)", not failed, "; ".join(failed)),
        check(
            "confirmation round interleaved the top candidates",
            len(contenders) >= 2 if confirm else (len(contenders) >= 2 or None),
            f"{len(contenders)} contender(s)"
            + ("" if confirm else " (not required in a dry run's short budget)"),
        ),
    ]


TRAINED = re.compile(r"TRAINED global_steps=(\d+) loss=(\S+) samples_per_s=(\S+)")


def train_checks(output: str, exit_code: int, steps: int) -> tuple[list[dict[str, Any]], dict]:
    match = TRAINED.search(output)
    data: dict[str, Any] = {}
    if match:
        data = {
            "global_steps": int(match[1]),
            "loss": float(match[2]),
            "samples_per_s": float(match[3]),
        }
    return [
        check("the exported config trains unedited", exit_code == 0, f"exit code {exit_code}"),
        check(
            f"{steps} optimizer steps with a finite loss",
            bool(data) and data["global_steps"] == steps and math.isfinite(data["loss"]),
            str(data) if data else "no TRAINED line in the output",
        ),
    ], data


# ---------------------------------------------------------------- pytest -m gpu

OUTCOMES = "PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED"
# "-rA" short summary lines, and "-v" lines as each test ends (all a killed run leaves)
SUMMARY_LINE = re.compile(rf"^({OUTCOMES})\s+(?:\[\d+\]\s+)?(\S+)", re.M)
VERBOSE_LINE = re.compile(rf"^(\S+::\S+)\s+({OUTCOMES})\b", re.M)


def pytest_outcomes(output: str) -> dict[str, str]:
    """Each test's outcome, from pytest's ``-v`` lines and its ``-rA`` short summary."""
    outcomes = {name: outcome for name, outcome in VERBOSE_LINE.findall(output)}
    outcomes.update({name.rstrip(":"): o for o, name in SUMMARY_LINE.findall(output)})
    return outcomes


def gpu_tests_checks(outcomes: dict[str, str], exit_code: int) -> list[dict[str, Any]]:
    bad = [f"{n}: {o}" for n, o in outcomes.items() if o in ("FAILED", "ERROR")]
    xpass = [n for n, o in outcomes.items() if o == "XPASS"]
    checks = [
        check(
            "every gpu test passed (or failed as marked xfail)",
            not bad and exit_code == 0,
            "; ".join(bad) or f"pytest exit code {exit_code}",
        ),
    ]
    if xpass:
        checks.append(
            check("xfail tests that now pass (drop their marker)", None, ", ".join(xpass))
        )
    return checks


# ---------------------------------------------------------------- the report


def phase_result_line(phase: dict[str, Any]) -> str:
    """The phase's row text: its reason, or its checks in short."""
    if phase.get("reason") and phase["status"] != "passed":
        return phase["reason"]
    judged = [c for c in phase.get("checks", []) if c["ok"] is not None]
    failed = [c["name"] for c in judged if not c["ok"]]
    if failed:
        return "failed: " + "; ".join(failed)
    return phase.get("summary") or f"{len(judged)} check(s) passed"


def render_markdown(report: dict[str, Any]) -> str:
    device = report.get("device") or "no GPU"
    lines = [
        f"## GPU check, {report['date']}, {device}"
        + (" (CPU dry run)" if report["dry_run"] else ""),
        "",
        f"`{report['command']}`",
        "",
        _machine_line(report),
        "",
        "| phase | status | seconds (limit) | result |",
        "|---|---|---|---|",
    ]
    for phase in report["phases"]:
        limit = f" ({phase['timeout_s']:.0f})" if phase.get("timeout_s") else ""
        lines.append(
            f"| {phase['name']} | {phase['status']} | {phase['seconds']:.1f}{limit} | "
            f"{_cell(phase_result_line(phase))} |"
        )
    lines += _memory_table(report)
    lines += _study_tables(report)
    lines += _checks_list(report)
    return "\n".join(lines) + "\n"


def _machine_line(report: dict[str, Any]) -> str:
    v = report.get("versions") or {}
    parts = [
        f"torch {v.get('torch', '?')} (CUDA {v.get('torch_cuda') or '-'})",
        f"driver {v.get('driver') or '-'}",
        f"DeepSpeed {v.get('deepspeed', '?')}",
        f"Optuna {v.get('optuna', '?')}",
        f"transformers {v.get('transformers', '?')}",
        f"Python {v.get('python', '?')}",
    ]
    total = f"{report['total_s']:.0f} s of the {report['budget_s']:.0f} s budget"
    return "; ".join(parts) + f". Whole check: {total}."


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:300]


def _memory_table(report: dict[str, Any]) -> list[str]:
    phase = next((p for p in report["phases"] if p["name"] == "memory"), None)
    rows = (phase or {}).get("data", {}).get("rows") or []
    if not rows:
        return []
    out = [
        "",
        f"Memory model against the allocator ({phase['data'].get('workload')}, 1 rank; "
        "predicted device peak per rank, no calibration; reserved = the caching allocator's "
        "peak without the context overhead):",
        "",
        "| candidate | predicted MiB | allocated MiB | error | reserved MiB | error | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('error', '')[:80]}"
        alloc = (r.get("allocated_bytes") or None) if r["status"] == "ok" else None
        res = (r.get("reserved_bytes") or None) if r["status"] == "ok" else None  # CPU: none
        out.append(
            f"| {r['label']}{'' if r.get('design') else ' (extra)'} | {mib(r['predicted_bytes'])} "
            f"| {mib(alloc)} | {pct(alloc and relative_error(r['predicted_bytes'], alloc))} "
            f"| {mib(res)} | {pct(res and relative_error(r['predicted_bytes'], res))} "
            f"| {_cell(status)} |"
        )
    s = phase["data"].get("summary", {})
    for key in ("allocated", "reserved"):
        e = s.get(key) or {}
        if e.get("n"):
            out.append(
                f"\nvs {key}: median |error| {100 * e['median_abs']:.2f}%, worst "
                f"{100 * e['worst_abs']:.2f}%, worst under-prediction "
                f"{100 * e['worst_under']:.2f}% over {e['n']} candidates"
            )
    return out


def _study_tables(report: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for phase in report["phases"]:
        summary = phase.get("data", {}).get("study")
        if not summary or not summary.get("contenders"):
            continue
        out += [
            "",
            f"{phase['name']}: confirmation round (probes interleaved, samples/s in order):",
            "",
            "| trial | candidate | probes (samples/s) | median ± 95% |",
            "|---|---|---|---|",
        ]
        for c in summary["contenders"]:
            probes = ", ".join(f"{x:.1f}" for x in c["samples_per_s"])
            out.append(
                f"| {c['trial']} | {c['label']} | {probes} | "
                f"{c['estimate'] or 0:.1f} ± {c['half_width'] or 0:.1f} |"
            )
    return out


def _checks_list(report: dict[str, Any]) -> list[str]:
    out = ["", "Checks:", ""]
    for phase in report["phases"]:
        for c in phase.get("checks", []):
            mark = {True: "yes", False: "NO", None: "-"}[c["ok"]]
            out.append(
                f"- {phase['name']}: {c['name']}: {mark}"
                + (f" ({_cell(c['detail'])})" if c["detail"] else "")
            )
    return out
