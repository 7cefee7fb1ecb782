"""The ideal search (benchmarks/search_efficiency_ideal.py): exact probes always pick the
best, noisy ones over close candidates cannot, and more probes help."""

from __future__ import annotations

from pathlib import Path

from benchmarks import search_efficiency_ideal as ideal
from benchmarks.search_efficiency_table import Table

ROOT = Path(__file__).resolve().parents[2]
AMX_TABLE = ROOT / "benchmarks" / "data" / "table_gpt-tiny-amx.json"
MiB = 2**20
UNLIMITED = 64 * 2**30


def test_the_close_candidates_are_the_feasible_ones_within_five_percent() -> None:
    table = Table.load(AMX_TABLE, UNLIMITED)
    best = table.best_possible()
    close = ideal.close_to_best(table)
    assert close[0] and table.truth(close[0]) == best
    outside = set(table.rows) - set(close)
    assert all(table.truth(k) >= 0.95 * best for k in close)
    assert all(table.truth(k) < 0.95 * best for k in outside if table.feasible(k))
    # under 48 MiB only ZeRO-0 fits: the close set is drawn from the feasible alone
    limited = Table.load(AMX_TABLE, 48 * MiB)
    assert all(limited.candidate(k).zero_stage == 0 for k in ideal.close_to_best(limited))


def test_exact_probes_always_pick_the_best() -> None:
    report = ideal.ideal_search(Table.load(AMX_TABLE, UNLIMITED, noise=0.0), repeats=50)
    assert report["best_share"] == {5: 1.0, 10: 1.0, 20: 1.0}


def test_noisy_probes_over_close_candidates_miss_some_picks_and_more_probes_help() -> None:
    report = ideal.ideal_search(Table.load(AMX_TABLE, UNLIMITED, noise=0.075), repeats=1000)
    top = report["best_share"]
    assert 0.5 < top[10] < 0.9  # four candidates within 5%, one probe's noise 7.5%
    assert top[5] < top[10] < top[20]
    for name in ("equal rounds", "halving"):
        assert all(report["shares"][name][b] <= top[b] for b in top)
