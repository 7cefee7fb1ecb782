"""How close does each search strategy get to the best configuration, in how many probes?

(a) Exhaustive tables: every valid candidate of a space probed on real hardware with
    ``--sampler grid``, then dumped to ``benchmarks/data/table_<name>.json``::

        autotune run --workload gpt-tiny --gpus 2 --space benchmarks/spaces/cpu_table.yaml \\
            --sampler grid --no-prune --max-timed-steps 10 --executor local --budget 45m \\
            --storage sqlite:////tmp/tables/tables.db --study table-gpt-tiny
        python benchmarks/search_efficiency.py dump --storage sqlite:////tmp/tables/tables.db \\
            --study table-gpt-tiny --out benchmarks/data/table_gpt-tiny.json

    The same grid measured several times (``--study A --study B ...``) gives a table of
    medians. A script study's grid (``autotune run --script train.py ... --sampler grid``)
    dumps the same way, with the parameters its probes reported for the cost model; it
    replays without a memory limit (its memory model is learned by a run's own probes).
    ``dump`` also records this CPU's matmul rate per precision (the cost model's compute
    prior, as a run measures it), so dump on the machine that measured the table.

(b) Replays: each strategy searches the table many times (different seeds, and a 3%
    Gaussian noise on every looked-up throughput, about what a short probe measures here),
    under a memory limit applied to the measured peaks. For budgets of 5, 10 and 20 probes
    it reports best-found / best-possible (median and worst over the repeats) and the
    probes needed to get within 2% of the best::

        python benchmarks/search_efficiency.py replay --table benchmarks/data/table_gpt-tiny.json \\
            --limit 1.5GiB --repeats 30

    In time instead (``--budget-s``): what a run of so many seconds exports, each probe
    taking its row's own wall time (``--probe-s``: scaled to that median) on the tuner's
    BudgetClock, with its reserve, settling and round::

        python benchmarks/search_efficiency.py replay --table benchmarks/data/table_dit-cpu.json \\
            --noise measured --budget-s 240 --repeats 30

(c) An ideal search: how often a search that knows the candidates within 5% of the best
    and spends every probe on them picks at >= 0.97 of the best, per budget, at the
    replay's noise (how far probes alone go; benchmarks/search_efficiency_ideal.py)::

        python benchmarks/search_efficiency.py ideal \\
            --table benchmarks/data/table_gpt-tiny-amx.json --noise 0.075 \\
            --out benchmarks/data/ideal_search_gpt-tiny-amx_unlimited_noise0.075.json

    and on a clock (``--budget-s 240 [--probe-s 15]``, as the timed replay it bounds).

Strategies: autotune's sampler (memory model + calibrated cost model, see
autotune/sampler.py), both as the best it believes after N probes and as what a run of N
probes exports after its confirmation round ("autotune, confirmed": the round is reserved
from the N probes as the tuner plans it), Optuna's TPE and random samplers (the tuner's
memory screen and de-duplication apply to them as in a real run), and a re-implementation
of DeepSpeed's autotuner "fast" strategy (deepspeed/autotuning/autotuner.py, documented
in benchmarks/search_efficiency_strategies.py), run once per precision of the table since
DeepSpeed keeps the user's. A proposal the memory model rules out costs no probe, as in a
real run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# run by path, this folder is first on sys.path; the repository root makes its sibling
# modules importable as the package ``benchmarks`` (as the tests import them) and autotune
# importable from this tree
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.search_efficiency_dump import dump
from benchmarks.search_efficiency_ideal import ideal_search, print_ideal_search, write_ideal_search
from benchmarks.search_efficiency_replay import replay, timed_replay
from benchmarks.search_efficiency_strategies import RULES, use_rule
from benchmarks.search_efficiency_table import NOISE, Bimodal, Table, pass_noise, probe_scale


def main(argv: list[str] | None = None) -> int:
    from autotune.units import parse_size

    args = _parser().parse_args(argv)
    if args.command == "dump":
        dump(args.storage, args.study, args.out)
        return 0
    limit = parse_size(args.limit, flag="--limit")
    noise = pass_noise(args.table) if args.noise == "measured" else float(args.noise)
    bimodal = Bimodal() if args.bimodal else None
    if args.command == "ideal":
        table = Table.load(args.table, limit, noise, bimodal)
        report = ideal_search(
            table,
            repeats=args.repeats,
            budget_s=args.budget_s,
            probe_scale=probe_scale(table, args.probe_s),
        )
        print_ideal_search(report, noise)
        if args.out:
            write_ideal_search(report, args.table, table, args.out)
        return 0
    use_rule(args.confirmation_rule)
    if args.budget_s is not None:
        timed_replay(
            args.table, limit, args.repeats, args.budget_s, args.out, noise, bimodal, args.probe_s
        )
        return 0
    replay(args.table, limit, args.repeats, args.max_probes, args.out, noise, bimodal)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="write a grid study's table as JSON")
    d.add_argument("--storage", required=True)
    d.add_argument(
        "--study",
        required=True,
        action="append",
        help="a grid study; repeat for repeated measurements of the same grid (median)",
    )
    d.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("replay", help="replay strategies against a table")
    c = sub.add_parser("ideal", help="how often an ideal search picks well on a table")
    for p in (r, c):
        p.add_argument("--table", type=Path, required=True)
        p.add_argument("--limit", default="64GiB", help="memory limit per rank on the peaks")
        _noise_and_mode_flags(p)
    r.add_argument("--repeats", type=int, default=30)
    c.add_argument("--repeats", type=int, default=20000)
    r.add_argument("--max-probes", type=int, default=40)
    r.add_argument("--out", type=Path, help="write the report as JSON here too")
    _time_flags(r)
    _time_flags(c)
    c.add_argument("--out", type=Path, help="write the shares as JSON here too")
    r.add_argument(
        "--confirmation-rule",
        choices=list(RULES),
        default=RULES[0],
        help="how the confirmation round ranks its contenders: the tuner's rule (default), "
        "or an earlier one for comparison",
    )
    return parser


def _time_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--budget-s",
        type=float,
        help="replay (or, for ideal, search) a run of this many seconds instead, each "
        "probe taking the table's own probe time",
    )
    parser.add_argument(
        "--probe-s",
        type=float,
        help="with --budget-s: the table's probe times scaled to this median (a slower "
        "machine or model)",
    )


def _noise_and_mode_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--noise",
        default=str(NOISE),
        help="relative standard deviation of one probe (default 0.03; the AMX table's "
        "three grid runs measured 0.075), or 'measured': the table's own pass-to-pass "
        "noise (a table of two or more grid runs; search_efficiency_table.pass_noise)",
    )
    parser.add_argument(
        "--bimodal",
        action="store_true",
        # argparse formats help with %: the percent signs are doubled
        help=f"offload candidates' probes in two modes: {100 * Bimodal.share:.0f}%% of them "
        f"{100 * Bimodal.slow:.0f}%% below the table's value, as CPU offload measured here",
    )


if __name__ == "__main__":
    sys.exit(main())
