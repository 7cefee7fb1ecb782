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

On a clock (``--budget-s``), a budget is seconds instead of probes: each probe takes its
table row's own wall time times the replay's noise (``ReplayTime``), the tuner's finish is
held back as in the timed replay, and the search probes while the next probe fits.

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
from autotune.run.budget import DEFAULT_FINISH_S
from benchmarks.search_efficiency.search_efficiency_replay import BUDGETS, GOOD_PICK
from benchmarks.search_efficiency.search_efficiency_table import Table

CLOSE = 0.05  # the candidates within this share of the best are the ideal search's
HALVING_KEEP = 3  # candidates the halving allocation keeps after one probe each

# how an ideal search spends a budget on the close candidates: (their order, the budget's
# allowance, a probe of one by key) -> each probed candidate's samples/s
Allocation = Callable[[list[str], "Allowance", Callable[[str], float]], dict[str, list[float]]]


class Allowance:
    """What is left of a budget: ``probes`` probes, or (``seconds``) a clock on which each
    probe takes ``wall_s(key)``; :meth:`take` spends one probe of ``key`` if it fits."""

    def __init__(
        self, probes: int = 0, seconds: float = 0.0, wall_s: Callable[[str], float] | None = None
    ) -> None:
        self.probes_left = probes
        self.seconds_left = seconds
        self.wall_s = wall_s

    def take(self, key: str) -> bool:
        if self.wall_s is None:
            self.probes_left -= 1
            return self.probes_left >= 0
        seconds = self.wall_s(key)
        if seconds > self.seconds_left:
            self.seconds_left = 0.0
            return False
        self.seconds_left -= seconds
        return True


def close_to_best(table: Table) -> list[str]:
    """The feasible candidates within ``CLOSE`` of the table's best, best first."""
    best = table.best_possible()
    close = [k for k in table.rows if table.feasible(k) and table.truth(k) >= (1 - CLOSE) * best]
    return sorted(close, key=table.truth, reverse=True)


def ideal_search(
    table: Table,
    budgets: tuple[int, ...] = BUDGETS,
    repeats: int = 20000,
    *,
    budget_s: float | None = None,
    probe_scale: float = 1.0,
) -> dict:
    """Per budget, the share of repeats in which each allocation of the ideal search picks
    at or above ``GOOD_PICK`` of the best, and the better of the two; with ``budget_s``, the
    one budget of that many seconds, each probe its row's wall time times ``probe_scale``."""
    close = close_to_best(table)
    best = table.best_possible()
    candidates = {key: table.candidate(key) for key in close}
    allocations: dict[str, Allocation] = {"equal rounds": _equal_rounds, "halving": _halving}
    keyed = (round(budget_s),) if budget_s is not None else budgets
    shares: dict[str, dict[int, float]] = {name: {} for name in allocations}
    for name, allocate in allocations.items():
        for budget in keyed:
            rng = random.Random(budget)
            probe = _prober(table, candidates, rng)
            good = 0
            for _ in range(repeats):
                order = close[:]
                rng.shuffle(order)
                if budget_s is None:
                    allowance = Allowance(probes=budget)
                else:
                    allowance = Allowance(
                        seconds=budget_s - DEFAULT_FINISH_S,
                        wall_s=_wall_s(table, probe_scale, rng),
                    )
                samples = allocate(order, allowance, probe)
                if not samples:
                    continue  # not one probe fits: no pick
                pick = max(samples, key=lambda k: statistics.fmean(samples[k]))
                good += table.truth(pick) >= GOOD_PICK * best
            shares[name][budget] = good / repeats
    report = {
        "close": [table.rows[k]["label"] for k in close],
        "close_share_of_best": [table.truth(k) / best for k in close],
        "repeats": repeats,
        "shares": shares,
        "best_share": {b: max(shares[n][b] for n in shares) for b in keyed},
    }
    if budget_s is not None:
        report["budget_s"] = budget_s
        report["probe_scale"] = probe_scale
    return report


def _wall_s(table: Table, scale: float, rng: random.Random) -> Callable[[str], float]:
    """One probe's wall time on the clock, as the timed replay's ``ReplayTime.wall_s``."""

    def wall_s(key: str) -> float:
        row_s = table.rows[key].get("probe_wall_s") or 1.0
        return scale * row_s * max(0.5, rng.gauss(1.0, table.noise))

    return wall_s


def _prober(
    table: Table, candidates: dict[str, Candidate], rng: random.Random
) -> Callable[[str], float]:
    def probe(key: str) -> float:
        status, value = table.probe(candidates[key], rng)
        assert status == "ok"  # the close candidates are feasible
        return value

    return probe


def _equal_rounds(
    order: list[str], allowance: Allowance, probe: Callable[[str], float]
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    i = 0
    while allowance.take(key := order[i % len(order)]):
        samples.setdefault(key, []).append(probe(key))
        i += 1
    return samples


def _halving(
    order: list[str], allowance: Allowance, probe: Callable[[str], float]
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    for key in order:
        if not allowance.take(key):
            return samples
        samples[key] = [probe(key)]
    kept = sorted(samples, key=lambda k: statistics.fmean(samples[k]), reverse=True)
    kept = kept[:HALVING_KEEP]
    i = 0
    while allowance.take(key := kept[i % len(kept)]):
        samples[key].append(probe(key))
        i += 1
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
    unit = " s" if "budget_s" in report else ""
    for budget, top in report["best_share"].items():
        equal = report["shares"]["equal rounds"][budget]
        halving = report["shares"]["halving"][budget]
        print(f"| {budget}{unit} | {equal:.3f} | {halving:.3f} | {top:.3f} ({30 * top:.1f}) |")


def write_ideal_search(report: dict, table_path: Path, table: Table, out: Path) -> None:
    """The report of :func:`ideal_search` as JSON at ``out``, with the table (its file name:
    no path, as a replay's), limit, noise and bimodal mode it was run at."""
    document = {
        "table": table_path.name,
        "limit_bytes": table.limit_bytes,
        "noise": table.noise,
        "bimodal": None
        if table.bimodal is None
        else {"share": table.bimodal.share, "slow": table.bimodal.slow},
        **report,
    }
    out.write_text(json.dumps(document, indent=1) + "\n")
