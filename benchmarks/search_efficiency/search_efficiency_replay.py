"""Replays: every strategy searches a measured table many times; how close each gets.

Each strategy (benchmarks/search_efficiency/search_efficiency_strategies.py) searches the
table once per seed; for budgets of 5, 10 and 20 probes the report gives best-found /
best-possible (median, mean and worst over the repeats) and the probes needed to get within
2% of the best, printed as a table and written as JSON.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

from benchmarks.search_efficiency.search_efficiency_strategies import (
    RULE_IN_USE,
    TIMED_RUNS,
    autotune_confirmed,
    run_autotune,
    run_deepspeed_fast,
    run_optuna,
)
from benchmarks.search_efficiency.search_efficiency_table import (
    NOISE,
    Bimodal,
    Models,
    Search,
    Table,
    probe_scale,
)

BUDGETS = (5, 10, 20)
WITHIN = 0.02
GOOD_PICK = 0.97  # a confirmed pick at this share of the best or more is a good one


def replay(
    path: Path,
    limit_bytes: int,
    repeats: int,
    max_probes: int,
    out: Path | None,
    noise: float = NOISE,
    bimodal: Bimodal | None = None,
) -> dict:
    """Every strategy, ``repeats`` searches each, on the table at ``path`` under
    ``limit_bytes``; the report, printed and (with ``out``) written as JSON."""
    table = Table.load(path, limit_bytes, noise, bimodal)
    models = Models(table)
    best = table.best_possible()
    results: dict[str, dict] = {}
    for name, strategy in strategies(table, models, max_probes).items():
        results[name] = scores(table, models, strategy, best, repeats)
        if name == "autotune":
            # The export of a run of each budget: search and confirmation within it.
            results["autotune, confirmed"] = confirmed_scores(table, models, best, repeats)
    report = {
        # the table's file name, no folder: a report holds no path, so that moving the
        # files leaves it byte-identical
        "table": path.name,
        "limit_bytes": limit_bytes,
        "candidates": len(table.rows),
        "feasible": sum(table.feasible(k) for k in table.rows),
        "best_samples_per_s": best,
        "best_label": next(
            table.rows[k]["label"]
            for k in table.rows
            if table.feasible(k) and table.truth(k) == best
        ),
        "repeats": repeats,
        "noise": noise,
        "bimodal": None if bimodal is None else {"share": bimodal.share, "slow": bimodal.slow},
        "confirmation_rule": RULE_IN_USE[0],
        "results": results,
    }
    print_report(report)
    if out:
        out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def timed_replay(
    path: Path,
    limit_bytes: int,
    repeats: int,
    budget_s: float,
    out: Path | None,
    noise: float = NOISE,
    bimodal: Bimodal | None = None,
    probe_s: float | None = None,
) -> dict:
    """What a run of ``budget_s`` seconds exports, ``repeats`` seeds, each probe taking the
    table's own probe time
    (:class:`~benchmarks.search_efficiency.search_efficiency_strategies.ReplayTime`): the
    good picks (>= :data:`GOOD_PICK` of the best) and the search's probes; printed and (with
    ``out``) written as JSON. ``probe_s``: the probes scaled so that their median takes this
    long (a slower machine or model, the same table's ranking)."""
    table = Table.load(path, limit_bytes, noise, bimodal)
    models = Models(table)
    best = table.best_possible()
    walls_s = [row["probe_wall_s"] for row in table.rows.values() if row.get("probe_wall_s")]
    scale = probe_scale(table, probe_s)
    TIMED_RUNS.clear()
    fractions = [
        autotune_confirmed(table, models, seed, 0, budget_s=budget_s, probe_scale=scale) / best
        for seed in range(repeats)
    ]
    probes = [run["search_probes"] for run in TIMED_RUNS]
    report = {
        "table": path.name,
        "limit_bytes": limit_bytes,
        "budget_s": budget_s,
        "probe_s_median": round(scale * statistics.median(walls_s), 2),
        "repeats": repeats,
        "noise": noise,
        "bimodal": None if bimodal is None else {"share": bimodal.share, "slow": bimodal.slow},
        "confirmation_rule": RULE_IN_USE[0],
        "good_picks": f"{sum(f >= GOOD_PICK for f in fractions)}/{repeats}",
        "median": statistics.median(fractions),
        "worst": min(fractions),
        "search_probes_median": statistics.median(probes),
        "fractions": [round(f, 4) for f in fractions],
    }
    print(
        f"{report['table']} at {budget_s:g} s, probes {report['probe_s_median']:g} s "
        f"({100 * noise:.1f}% noise): good picks "
        f"{report['good_picks']}, median {report['median']:.3f}, worst {report['worst']:.3f}, "
        f"search probes (median) {report['search_probes_median']:g}"
    )
    if out:
        out.write_text(json.dumps(report, indent=1) + "\n")
    return report


def strategies(
    table: Table, models: Models, max_probes: int
) -> dict[str, Callable[[Search], None]]:
    """Each strategy by its report name, as one search of at most ``max_probes``."""
    named: dict[str, Callable[[Search], None]] = {
        "autotune": lambda s: run_autotune(table, s, max_probes, models),
        "optuna-tpe": lambda s: run_optuna(table, s, max_probes, "tpe"),
        "random": lambda s: run_optuna(table, s, max_probes, "random"),
    }
    precisions = sorted({c.precision for c in table.candidates}, key=lambda p: p != "fp32")
    for precision in precisions:  # fp32 first: DeepSpeed's default when the config says none
        named[f"deepspeed-fast ({precision})"] = lambda s, precision=precision: run_deepspeed_fast(
            table, s, max_probes, precision
        )
    return named


def scores(
    table: Table,
    models: Models,
    strategy: Callable[[Search], None],
    best: float,
    repeats: int,
) -> dict:
    """One strategy's result over ``repeats`` seeds: fractions of ``best`` per budget, and
    the probes it needed to get within 2% of it."""
    fractions: dict[int, list[float]] = {b: [] for b in BUDGETS}
    needed: list[int | None] = []
    probes_used: list[int] = []
    for seed in range(repeats):
        search = Search(table, models.may_fit, seed)
        strategy(search)
        probes_used.append(search.probes)
        for budget in BUDGETS:
            fractions[budget].append(search.trajectory.at(budget) / best)
        within = [
            i + 1 for i, v in enumerate(search.trajectory.believed) if v >= best * (1 - WITHIN)
        ]
        needed.append(within[0] if within else None)
    reached = [n for n in needed if n is not None]
    return {
        **fraction_summary(fractions),
        "probes_to_within_2pct_median": statistics.median(reached)
        if len(reached) > repeats // 2
        else None,
        "reached_within_2pct": f"{len(reached)}/{repeats}",
        "probes_used_median": statistics.median(probes_used),
    }


def confirmed_scores(table: Table, models: Models, best: float, repeats: int) -> dict:
    """What a run of each budget exports (:func:`autotune_confirmed`), as fractions of
    ``best`` over ``repeats`` seeds."""
    confirmed = {
        b: [autotune_confirmed(table, models, seed, b) / best for seed in range(repeats)]
        for b in BUDGETS
    }
    return {
        **fraction_summary(confirmed),
        "probes_to_within_2pct_median": None,
        "reached_within_2pct": "-",
        "probes_used_median": None,
        "good_picks": {
            b: f"{sum(f >= GOOD_PICK for f in confirmed[b])}/{repeats}" for b in BUDGETS
        },
    }


def fraction_summary(fractions: dict[int, list[float]]) -> dict:
    """Median, worst and mean of the fractions per budget."""
    return {
        "median": {b: statistics.median(fractions[b]) for b in BUDGETS},
        "worst": {b: min(fractions[b]) for b in BUDGETS},
        "mean": {b: statistics.fmean(fractions[b]) for b in BUDGETS},
    }


def print_report(report: dict) -> None:
    from autotune.units import format_bytes

    print(
        f"{report['table']}: {report['candidates']} candidates, {report['feasible']} feasible "
        f"under {format_bytes(report['limit_bytes'])}; best {report['best_label']} "
        f"{report['best_samples_per_s']:.1f} samples/s; {report['repeats']} repeats, "
        f"{100 * report['noise']:.1f}% probe noise"
        + (" (bimodal offload probes)" if report.get("bimodal") else "")
    )
    header = "| strategy | " + " | ".join(f"{b} probes: median / mean (worst)" for b in BUDGETS)
    print(header + " | probes to within 2% (median; runs that got there) |")
    print("|" + " --- |" * (len(BUDGETS) + 2))
    for name, r in report["results"].items():
        cells = [
            f"{r['median'][b]:.3f} / {r['mean'][b]:.3f} ({r['worst'][b]:.3f})" for b in BUDGETS
        ]
        needed = r["probes_to_within_2pct_median"]
        needed_text = f"{needed:g}" if needed is not None else "-"
        reached = r["reached_within_2pct"]
        print(f"| {name} | " + " | ".join(cells) + f" | {needed_text} ({reached}) |")
    for name, r in report["results"].items():
        if "good_picks" in r:
            counts = ", ".join(f"{r['good_picks'][b]} at {b}" for b in BUDGETS)
            print(f"{name}: a pick at >= {GOOD_PICK} of the best in {counts} probes")
