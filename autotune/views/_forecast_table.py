"""``autotune plan --study S --gpus N``: the study's configurations at other world sizes
(:class:`~autotune.run.forecast.Forecast`), as a table and the choice."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from autotune.units import format_duration

if TYPE_CHECKING:
    from autotune.run.forecast import Forecast, ForecastRow


def forecast_report(forecast: Forecast, *, limit_rows: int | None) -> Group:
    """The header (what the model was fitted on), one row per configuration and world
    size (predicted unless measured), and the objective's choice."""
    goal = forecast.goal
    probed = ", ".join(str(n) for n in forecast.probed_world_sizes)
    header = [
        Text(
            f"study {forecast.study}: its cost model fitted on {forecast.observations} measured "
            f"probe(s) at {probed} rank(s), predicting "
            f"{', '.join(str(n) for n in forecast.world_sizes)} GPU(s) "
            f"({forecast.gpus_per_node} per node); objective {goal.objective}"
        )
    ]
    header += [Text(f"note: {note}") for note in forecast.notes]
    cost_basis = "the run" if any(r.cost_basis == "run" for r in forecast.rows) else "1M samples"
    table = Table(
        box=box.SIMPLE_HEAD,  # nine columns in 80: no vertical rules, one space between
        pad_edge=False,
        padding=(0, 0, 0, 1),
        title="by the objective, fitting first; samples/s measured (m) or predicted (p), "
        "error: predicted against measured"
        + (f"; USD for {cost_basis}" if any(r.cost_usd is not None for r in forecast.rows) else ""),
    )
    columns = ["GPUs", "configuration", "samples/s", "/GPU", "error", "fits"]
    if any(r.time_to_train_s is not None for r in forecast.rows):
        columns.append("time")
    if any(r.cost_usd is not None for r in forecast.rows):
        columns.append("USD")
    if goal.deadline_s is not None:
        columns.append("in time")
    for column in columns:  # the configuration and a reason wrap; numbers stay whole
        wraps = column in ("configuration", "fits")
        table.add_column(
            column,
            justify="left" if wraps else "right",
            no_wrap=not wraps,
            min_width=13 if column == "configuration" else None,
        )
    rows = forecast.rows if limit_rows is None else forecast.rows[:limit_rows]
    for row in rows:
        table.add_row(*_cells(row, columns))
    footer = []
    if limit_rows is not None and len(forecast.rows) > limit_rows:
        more = len(forecast.rows) - limit_rows
        footer.append(Text(f"... {more} more (use --all to list every one)"))
    footer.append(Text(forecast.choice))
    return Group(*header, table, *footer)


def _cells(row: ForecastRow, columns: list[str]) -> list[str]:
    kind = "m" if row.measured_samples_per_s else "p"
    cells = [
        str(row.gpus),
        f"{row.candidate.label} (trial {row.trial})",
        f"{row.samples_per_s:.1f} {kind}",
        f"{row.samples_per_s / row.gpus:.1f}",
        "" if row.error is None else f"{100 * row.error:+.0f}%",
        "yes" if row.fits else f"no ({row.why_not})",
    ]
    if "time" in columns:
        seconds = row.time_to_train_s
        cells.append("" if seconds is None else format_duration(seconds))
    if "USD" in columns:
        cells.append("" if row.cost_usd is None else f"{row.cost_usd:,.2f}")
    if "in time" in columns:
        cells.append({True: "yes", False: "no", None: ""}[row.finishes])
    return cells
