"""The GPU check's study, training and pytest checks, over the `autotune status --json`
document, the exported config's training output and pytest's lines.

Pure functions over data, standard library only (the check's driver imports this before
anything is installed); tests/benchmarks/test_gpu_check.py feeds them recorded shapes,
tests/benchmarks/test_gpu_check_doctored.py doctored ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from .report import check


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


def _run_checks(
    status: dict[str, Any], exit_code: int, exported: bool, *, min_probes: int
) -> list[dict[str, Any]]:
    """An ``autotune run``: it exported, measured enough probes, and none failed."""
    trials = status.get("trials", [])
    ok = [t for t in trials if t.get("status") == "ok"]
    failed = [
        f"trial {t['number']} {t['label']}: {t['status']} {(t.get('error') or '')[:160]}"
        for t in trials
        if t.get("status") in ("error", "timeout")
    ]
    return [
        check(
            "the run exported a config (exit code 0)",
            exit_code == 0 and exported,
            f"exit code {exit_code}" + ("" if exported else "; no export"),
        ),
        check(f"at least {min_probes} probe(s) measured", len(ok) >= min_probes, f"{len(ok)} ok"),
        check("no probe failed (error, timeout)", not failed, "; ".join(failed)),
    ]


def study_checks(
    status: dict[str, Any], exit_code: int, exported: bool, *, min_probes: int, confirm: bool
) -> list[dict[str, Any]]:
    """A built-in workload's study: :func:`_run_checks`, and on a GPU its confirmation round
    (a dry run's short budget need not reach one: not verified there unless it did)."""
    contenders = (status.get("confirmation") or {}).get("contenders", [])
    return [
        *_run_checks(status, exit_code, exported, min_probes=min_probes),
        check(
            "confirmation round interleaved the top candidates",
            len(contenders) >= 2 if confirm else (len(contenders) >= 2 or None),
            f"{len(contenders)} contender(s)"
            + ("" if confirm else " (not required in a dry run's short budget)"),
        ),
    ]


def script_checks(
    status: dict[str, Any],
    reports: dict[int, dict[str, Any]],
    exit_code: int,
    exported: bool,
    *,
    min_probes: int,
) -> list[dict[str, Any]]:
    """``autotune run --script``: :func:`_run_checks`, and every measured probe's rank report
    learned the script's activation memory (``activation_bytes`` > 0, what the memory
    screen predicts the next candidates from)."""
    ok = [t["number"] for t in status.get("trials", []) if t.get("status") == "ok"]
    learned = {n: int((reports.get(n) or {}).get("activation_bytes") or 0) for n in ok}
    missing = [f"trial {n}: no rank report" for n in ok if n not in reports]
    zero = [f"trial {n}: 0" for n in ok if n in reports and not learned[n]]
    shown = ", ".join(f"trial {n}: {b / 2**20:.2f} MiB" for n, b in learned.items() if b)
    return [
        *_run_checks(status, exit_code, exported, min_probes=min_probes),
        check(
            "activation bytes learned from every measured probe (rank report > 0)",
            bool(ok) and not missing and not zero,
            "; ".join(missing + zero) or shown or "no probe measured",
        ),
    ]


# how far the exported config's training may run below or above the study's measured
# samples/s: the training is a separate launch with its own warm-up and fewer steps than a
# confirmed estimate, so its rate scatters more than the study's confidence interval
TRAIN_SPEED_TOLERANCE = 0.15


def train_speed_check(
    trained: float | None, study: float | None, judged: bool = True
) -> dict[str, Any]:
    """The exported config trains at the study's measured speed, within the tolerance
    (``judged`` False: CPU ranks sharing busy cores, reported not verified)."""
    name = f"the exported config trains within {TRAIN_SPEED_TOLERANCE:.0%} of the study's speed"
    if not trained or not study or not judged:
        why = "" if judged else "; CPU ranks on shared cores: judged on a GPU"
        return check(name, None, f"trained {trained}, study {study} samples/s{why}")
    ratio = trained / study
    ok = abs(ratio - 1) <= TRAIN_SPEED_TOLERANCE
    return check(name, ok, f"{trained:.1f} vs {study:.1f} samples/s ({ratio:.2f}x)")


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
    """pytest -m gpu over the tests in the plan: every one ran and passed. A test that
    failed as marked xfail did not pass (what it checks does not hold on this GPU), nor did
    one skipped on it; none collected is a failure too (pytest's exit code 5). XPASS is a
    pass: its assertions held (its marker is not strict)."""
    bad = [f"{n}: {o}" for n, o in outcomes.items() if o not in ("PASSED", "XPASS")]
    return [
        check(
            "every gpu test in the plan passed (a failure marked xfail is no pass)",
            not bad and exit_code == 0 and bool(outcomes),
            "; ".join(bad) or f"{len(outcomes)} tests; pytest exit code {exit_code}",
        ),
    ]


# the prediction's error the world-size check accepts: the cost model's communication terms
# are fitted on a study at one device, where they are zero (their prior, the nominal link)
PREDICTION_TOLERANCE = 0.25


def world_size_prediction_check(rows: list[dict[str, Any]], judged: bool = True) -> dict[str, Any]:
    """The prediction of 2 devices from a study at 1 against probes at 2: the median of
    ``rows``' |predicted / measured - 1| within :data:`PREDICTION_TOLERANCE` (``judged``
    False: CPU ranks sharing busy cores, reported not verified)."""
    import statistics

    name = (
        f"the prediction of 2 devices from probes at 1 is within {PREDICTION_TOLERANCE:.0%} "
        "of the probes at 2 (median)"
    )
    if not rows:
        return check(name, None, "no configuration measured at both")
    median = statistics.median(abs(r["predicted"] / r["measured"] - 1) for r in rows)
    detail = f"median |error| {100 * median:.0f}% over {len(rows)} configuration(s)"
    if not judged:
        return check(name, None, detail + "; CPU ranks on shared cores: judged on GPUs")
    return check(name, median <= PREDICTION_TOLERANCE, detail)
