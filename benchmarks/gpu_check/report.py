"""The GPU check's report: the shape of a check, the units it is written in, and the
markdown table (gpu_check.md) of a whole check.

Pure functions over data, standard library only (the check's driver imports this before
anything is installed); tests/benchmarks/test_gpu_check.py feeds them recorded shapes.

A check is ``{"name", "ok", "detail"}`` with ``ok`` True (passed), False (failed) or None
(not verified: a target that applies on CUDA only, a step the run did not reach; ``detail``
says why). Checks are made by the judging modules only (setup_checks.py, memory_checks.py,
precision_checks.py, fsdp2_checks.py, oom_checks.py, study_checks.py), each able to fail
(tests/benchmarks/test_gpu_check_doctored.py); what is a fact, not a judgement (FusedAdam
builds here or not), goes in a phase's data and summary. The whole check's verdict
(:func:`verdict`) is passed only when nothing failed and nothing is left not verified: a
skipped phase, one that ran out of time or never ran, a check with ``ok`` None, a test left
outside the time plan and what one GPU cannot show each count as not verified, with their
reason; the last in a count of their own. What each check
expects, with the number that passes it: docs/gpu_expectations.md.
"""

from __future__ import annotations

from typing import Any

MiB = 2**20
GiB = 2**30


# what a check on one GPU cannot show, whatever its phases find: listed as not verified,
# each with its reason, and counted apart from what one GPU could have shown
ONE_GPU_CANNOT_SHOW = (
    (
        "2+ ranks: data parallel, ZeRO partitioned across ranks, the slowest rank's step",
        "one GPU runs one rank per probe",
    ),
    (
        "NCCL communicator memory across ranks (counted in each rank's limit)",
        "a probe of one rank creates no NCCL communicator: there is no peer to connect to",
    ),
    (
        "probes spanning nodes (--ray-address, a placement group over several nodes)",
        "one GPU sits on one node",
    ),
)
BEYOND_ONE_GPU = "beyond one GPU"
EXIT_PASSED, EXIT_FAILED, EXIT_NOT_VERIFIED = 0, 1, 3


def verdict(
    phases: list[dict[str, Any]],
    expected: list[str] | tuple[str, ...] = (),
    beyond: tuple[tuple[str, str], ...] = ONE_GPU_CANNOT_SHOW,
) -> dict[str, Any]:
    """Every phase and check as passed, failed or not verified, with each one's reason. A
    phase of ``expected`` missing from ``phases`` (the run never reached it) is not
    verified; so is what a phase left outside the time plan, and each item of ``beyond``
    (what the machine cannot show), counted apart in ``beyond_one_gpu``. ``judged`` counts
    the checks that passed or failed (not those left not verified). Passed only when
    nothing failed and nothing is left not verified."""
    passed: list[str] = []
    failed: list[dict[str, str]] = []
    not_verified: list[dict[str, str]] = []
    judged = 0
    for phase in phases:
        name = phase["name"]
        not_verified += [
            {"where": f"{name}: {item['where']}", "reason": item["reason"]}
            for item in phase.get("outside_plan", [])
        ]
        for c in phase.get("checks", []):
            judged += c["ok"] is not None
            where = f"{name}: {c['name']}"
            if c["ok"] is True:
                passed.append(where)
            elif c["ok"] is False:
                failed.append({"where": where, "reason": c["detail"] or "failed"})
            else:
                not_verified.append({"where": where, "reason": c["detail"] or "not judged"})
        reason = phase.get("reason") or phase["status"]
        if phase["status"] == "failed" and not any(c["ok"] is False for c in phase["checks"]):
            failed.append({"where": name, "reason": reason})
        elif phase["status"] in ("skipped", "timeout"):
            not_verified.append({"where": name, "reason": f"{phase['status']}: {reason}"})
    seen = {phase["name"] for phase in phases}
    for name in expected:
        if name not in seen:
            not_verified.append({"where": name, "reason": "missing: the run did not reach it"})
    for what, why in beyond:
        not_verified.append({"where": what, "reason": f"{BEYOND_ONE_GPU}: {why}"})
    status = "failed" if failed else "not verified" if not_verified else "passed"
    return {
        "status": status,
        "passed": len(passed),
        "judged": judged,
        "failed": failed,
        "not_verified": not_verified,
        "beyond_one_gpu": len(beyond),
    }


def exit_code(status: str) -> int:
    return {"passed": EXIT_PASSED, "failed": EXIT_FAILED}.get(status, EXIT_NOT_VERIFIED)


def check(name: str, ok: bool | None, detail: str = "") -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail}


def mib(value: float | None) -> str:
    return "" if value is None else f"{value / MiB:.1f}"


def pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:+.1f}%"


def relative_error(predicted: float, measured: float) -> float | None:
    return (predicted - measured) / measured if measured else None


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
        *_verdict_lines(report),
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


def _verdict_lines(report: dict[str, Any]) -> list[str]:
    v = report.get("verdict")
    if not v:
        return []
    lines = [f"**Verdict: {v['status']}**: {verdict_counts(v)}.", ""]
    for title, items in (("Failed", v["failed"]), ("Not verified", v["not_verified"])):
        if items:
            lines += [f"{title}:", ""]
            lines += [f"- {i['where']}: {_cell(i['reason'])}" for i in items]
            lines.append("")
    return lines


def verdict_counts(v: dict[str, Any]) -> str:
    """The verdict's counts, what one GPU cannot show apart from what it could."""
    beyond = v.get("beyond_one_gpu", 0)
    within = len(v["not_verified"]) - beyond
    judged = f" ({v['judged']} checks judged)" if "judged" in v else ""
    return (
        f"{v['passed']} passed, {len(v['failed'])} failed{judged}, {within} not verified, "
        f"and {beyond} not verified {BEYOND_ONE_GPU} (what one GPU cannot show)"
    )


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
        f"Memory model against the allocator ({phase['data'].get('workload')}, "
        f"{phase['data'].get('ranks', 1)} rank(s); "
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
            mark = {True: "yes", False: "NO", None: "not verified"}[c["ok"]]
            out.append(
                f"- {phase['name']}: {c['name']}: {mark}"
                + (f" ({_cell(c['detail'])})" if c["detail"] else "")
            )
    return out
