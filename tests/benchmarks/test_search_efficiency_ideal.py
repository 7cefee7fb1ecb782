"""The ideal search (benchmarks/search_efficiency/search_efficiency_ideal.py): exact probes
always pick the best, noisy ones over close candidates cannot, and more probes help."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.search_efficiency import search_efficiency_ideal as ideal
from benchmarks.search_efficiency.search_efficiency_table import Bimodal, Table

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "search_efficiency" / "data"
AMX_TABLE = DATA / "table_gpt-tiny-amx.json"
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


def test_on_a_clock_the_probes_that_fit_the_seconds_are_the_budget() -> None:
    """``budget_s``: each probe takes its row's wall time, the tuner's finish is held back;
    a clock that holds about as many probes as a count gets about its share, a clock too
    short for one probe picks nothing, and slower probes (``probe_scale``) get fewer."""
    from autotune.run.budget import DEFAULT_FINISH_S

    table = Table.load(AMX_TABLE, UNLIMITED, noise=0.075)
    walls = [table.rows[k]["probe_wall_s"] for k in ideal.close_to_best(table)]
    ten_probes_s = DEFAULT_FINISH_S + 10 * sum(walls) / len(walls)
    counted = ideal.ideal_search(table, budgets=(10,), repeats=2000)["best_share"][10]
    timed = ideal.ideal_search(table, repeats=2000, budget_s=ten_probes_s)
    assert timed["budget_s"] == ten_probes_s and timed["probe_scale"] == 1.0
    (share,) = timed["best_share"].values()
    assert abs(share - counted) < 0.06
    none = ideal.ideal_search(table, repeats=100, budget_s=DEFAULT_FINISH_S + 0.1)
    assert list(none["best_share"].values()) == [0.0]
    slow = ideal.ideal_search(table, repeats=2000, budget_s=ten_probes_s, probe_scale=3.0)
    (slow_share,) = slow["best_share"].values()
    assert slow_share < share


def test_the_report_is_written_with_what_it_was_run_at(tmp_path: Path) -> None:
    table = Table.load(AMX_TABLE, UNLIMITED, noise=0.075, bimodal=Bimodal())
    report = ideal.ideal_search(table, repeats=100)
    out = tmp_path / "ideal.json"
    ideal.write_ideal_search(report, AMX_TABLE, table, out)
    written = json.loads(out.read_text())
    assert written["table"] == "table_gpt-tiny-amx.json"  # its name, no path
    assert written["limit_bytes"] == UNLIMITED and written["noise"] == 0.075
    assert written["bimodal"] == {"share": Bimodal.share, "slow": Bimodal.slow}
    assert written["best_share"] == {str(b): share for b, share in report["best_share"].items()}
    assert written["close"] == report["close"]


def test_the_committed_ideal_searches_bound_the_tables_as_they_are() -> None:
    # benchmarks/search_efficiency/data/ideal_search_*.json (RESULTS.md, docs/search.md):
    # the candidates each drew on are the table's close ones today, at the table, limit and
    # mode it names
    files = sorted(DATA.glob("ideal_search_*.json"))
    assert len(files) == 15 + 11  # counted, and on a 4-minute clock (*_240s*)
    for path in files:
        written = json.loads(path.read_text())
        bimodal = Bimodal() if written["bimodal"] else None
        # the table it names lies beside it
        table = Table.load(path.parent / written["table"], written["limit_bytes"], bimodal=bimodal)
        close = ideal.close_to_best(table)
        assert written["close"] == [table.rows[k]["label"] for k in close], path.name
        assert written["repeats"] == 20000, path.name
