"""How often does an ideal search pick well on a table, at a budget and a probe noise?

The replays count the confirmed picks at >= 0.97 of a table's best (``GOOD_PICK``). Where
several candidates lie close to the best, noisy probes cannot always tell them apart, and
no strategy that ranks by probes reaches every seed. This measures how far probes go with
an ideal search: it knows before its first probe which feasible candidates lie within 5%
of the best (``CLOSE``: the ones a good pick must be told apart from; the rest a probe or
two rules out) and spends every probe of the budget on them, in the better of two
allocations:

- **equal rounds**: the close candidates in turn, a random order each repeat;
- **halving**: one probe each, then the rest in turn on the three highest by mean.

It picks the highest mean (the probes are the replay's: ``Table.probe``, with its noise
and bimodal mode). autotune's confirmed export has to find those candidates first, with
probes from the same budget; it can still do better where something other than the
probes decides well: its simplicity order wins a tie for the simplest candidate, which on
some tables is also the fastest.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable
from pathlib import Path

from autotune.candidate import Candidate
from benchmarks.search_efficiency_replay import BUDGETS, GOOD_PICK
from benchmarks.search_efficiency_table import Table, relative

CLOSE = 0.05  # the candidates within this share of the best are the ideal search's
HALVING_KEEP = 3  # candidates the halving allocation keeps after one probe each

# how an ideal search spends a budget on the close candidates: (their order, the budget,
# a probe of one by key) -> each probed candidate's samples/s
Allocation = Callable[[list[str], int, Callable[[str], float]], dict[str, list[float]]]


def close_to_best(table: Table) -> list[str]:
    """The feasible candidates within ``CLOSE`` of the table's best, best first."""
    best = table.best_possible()
    close = [k for k in table.rows if table.feasible(k) and table.truth(k) >= (1 - CLOSE) * best]
    return sorted(close, key=table.truth, reverse=True)


def ideal_search(table: Table, budgets: tuple[int, ...] = BUDGETS, repeats: int = 20000) -> dict:
    """Per budget, the share of repeats in which each allocation of the ideal search picks
    at or above ``GOOD_PICK`` of the best, and the better of the two."""
    close = close_to_best(table)
    best = table.best_possible()
    candidates = {key: table.candidate(key) for key in close}
    allocations: dict[str, Allocation] = {"equal rounds": _equal_rounds, "halving": _halving}
    shares: dict[str, dict[int, float]] = {name: {} for name in allocations}
    for name, allocate in allocations.items():
        for budget in budgets:
            rng = random.Random(budget)
            probe = _prober(table, candidates, rng)
            good = 0
            for _ in range(repeats):
                order = close[:]
                rng.shuffle(order)
                samples = allocate(order, budget, probe)
                pick = max(samples, key=lambda k: statistics.fmean(samples[k]))
                good += table.truth(pick) >= GOOD_PICK * best
            shares[name][budget] = good / repeats
    return {
        "close": [table.rows[k]["label"] for k in close],
        "close_share_of_best": [table.truth(k) / best for k in close],
        "repeats": repeats,
        "shares": shares,
        "best_share": {b: max(shares[n][b] for n in shares) for b in budgets},
    }


def _prober(
    table: Table, candidates: dict[str, Candidate], rng: random.Random
) -> Callable[[str], float]:
    def probe(key: str) -> float:
        status, value = table.probe(candidates[key], rng)
        assert status == "ok"  # the close candidates are feasible
        return value

    return probe


def _equal_rounds(
    order: list[str], budget: int, probe: Callable[[str], float]
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    for i in range(budget):
        key = order[i % len(order)]
        samples.setdefault(key, []).append(probe(key))
    return samples


def _halving(
    order: list[str], budget: int, probe: Callable[[str], float]
) -> dict[str, list[float]]:
    samples = {key: [probe(key)] for key in order[:budget]}
    kept = sorted(samples, key=lambda k: statistics.fmean(samples[k]), reverse=True)
    kept = kept[:HALVING_KEEP]
    for i in range(budget - len(samples)):
        key = kept[i % len(kept)]
        samples[key].append(probe(key))
    return samples


def print_ideal_search(report: dict, noise: float) -> None:
    close = ", ".join(
        f"{label} {share:.3f}"
        for label, share in zip(report["close"], report["close_share_of_best"], strict=True)
    )
    print(f"within {100 * CLOSE:.0f}% of the best ({len(report['close'])}): {close}")
    print(
        f"an ideal search's picks at >= {GOOD_PICK} of the best, {100 * noise:.1f}% probe "
        f"noise, {report['repeats']} repeats:"
    )
    print("| budget | equal rounds | halving | the better (of 30) |")
    print("| --- | --- | --- | --- |")
    for budget, top in report["best_share"].items():
        equal = report["shares"]["equal rounds"][budget]
        halving = report["shares"]["halving"][budget]
        print(f"| {budget} | {equal:.3f} | {halving:.3f} | {top:.3f} ({30 * top:.1f}) |")


def write_ideal_search(report: dict, table_path: Path, table: Table, out: Path) -> None:
    """The report of :func:`ideal_search` as JSON at ``out``, with the table, limit, noise
    and bimodal mode it was run at."""
    document = {
        "table": relative(str(table_path.resolve())),
        "limit_bytes": table.limit_bytes,
        "noise": table.noise,
        "bimodal": None
        if table.bimodal is None
        else {"share": table.bimodal.share, "slow": table.bimodal.slow},
        **report,
    }
    out.write_text(json.dumps(document, indent=1) + "\n")
