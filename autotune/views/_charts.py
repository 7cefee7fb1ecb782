"""The HTML report's charts, as inline SVG (:mod:`autotune.views._svg`), from :mod:`report_data`.

Colours are fixed, so that a reader learns them once and the browser test can find each
kind of mark in a screenshot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.units import format_bytes
from autotune.views import _svg as svg
from autotune.views._report_data import FEASIBLE, INFEASIBLE, NOT_PROBED, STOPPED

if TYPE_CHECKING:
    from autotune.views._report_data import Point, ReportData

FEASIBLE_COLOR = "#1f77b4"
STOPPED_COLOR = "#6baed6"
INFEASIBLE_COLOR = "#d62728"
NOT_PROBED_COLOR = "#8c8c8c"
CHOSEN_COLOR = "#ffb000"
LIMIT_COLOR = "#9c27b0"
BEST_LINE_COLOR = "#ff7f0e"
INTERVAL_COLOR = "#17becf"
IMPORTANCE_COLOR = "#2ca02c"
REFERENCE_LOSS_COLOR = "#555555"
CHOSEN_LOSS_COLOR = BEST_LINE_COLOR
KIND_COLOR = {
    FEASIBLE: FEASIBLE_COLOR,
    STOPPED: STOPPED_COLOR,
    INFEASIBLE: INFEASIBLE_COLOR,
    NOT_PROBED: NOT_PROBED_COLOR,
}


def memory_unit(limit_bytes: float) -> tuple[str, float]:
    return ("GiB", 2.0**30) if limit_bytes >= 4 * 2**30 else ("MiB", 2.0**20)


def _tip(point: Point, extra: str = "") -> str:
    rate = f"{point.samples_per_s:.1f} samples/s" if point.samples_per_s is not None else ""
    peak = f"peak {format_bytes(point.peak_bytes)}" if point.peak_bytes else ""
    predicted = f"predicted {format_bytes(point.predicted_bytes)}" if point.predicted_bytes else ""
    parts = [f"trial {point.trial} {point.label}", point.kind, rate, peak, predicted, point.why]
    return "; ".join(p for p in [*parts, extra] if p)


def _mark(point: Point, x: float, y: float) -> str:
    css = "mark-" + point.kind.replace(" ", "-")
    color = KIND_COLOR.get(point.kind, NOT_PROBED_COLOR)
    tip = _tip(point)
    if point.kind == INFEASIBLE:
        return svg.cross(x, y, color, tip=tip, css=css)
    if point.kind == NOT_PROBED:
        return svg.triangle(x, y, color, tip=tip, css=css)
    return svg.dot(x, y, color, tip=tip, css=css, hollow=point.kind == STOPPED)


def _chosen(point: Point, x: float, y: float) -> str:
    return svg.star(
        x, y, CHOSEN_COLOR, tip=_tip(point, "the chosen configuration"), css="mark-chosen"
    )


def _label_room(labels: list[str]) -> int:
    """Left margin for rows named by ``labels`` (about 7 px a character at 12 px)."""
    return min(420, 24 + 7 * max((len(label) for label in labels), default=10))


def throughput_memory(data: ReportData) -> str:
    """Samples/s against measured peak memory per rank, the limit drawn; candidates judged
    infeasible without a probe sit on the floor at their predicted peak."""
    limit = data.limit_bytes
    unit, scale = memory_unit(limit)
    measured = [p for p in data.points if p.peak_bytes is not None]
    x_high = max([limit * 1.12, *[p.peak_bytes * 1.08 for p in measured if p.peak_bytes]])
    rates = [p.samples_per_s for p in data.points if p.samples_per_s is not None]
    axes = svg.Axes(0, x_high / scale, 0, max([1.0, *rates]) * 1.12, width=720, height=380)
    parts = axes.frame(f"peak memory per rank ({unit})", "samples/s (global)")
    limit_x = axes.x(limit / scale)
    parts.append(
        '<g class="limit-line">'
        + svg.line(limit_x, axes.top, limit_x, axes.height - axes.bottom, LIMIT_COLOR, 3, "8 4")
        + "</g>"
    )
    parts.append(svg.text(limit_x - 4, axes.top + 12, f"limit {format_bytes(limit)}", anchor="end"))
    chosen = None
    right_edge = axes.width - axes.right - 8
    for point in data.points:
        if point.kind == NOT_PROBED and point.predicted_bytes is not None:
            x = min(axes.x(point.predicted_bytes / scale), right_edge)
            parts.append(_mark(point, x, axes.y(0) - 8))
        elif point.kind == INFEASIBLE and point.peak_bytes is None:
            # out of memory before a peak was reported: past the limit, at its prediction
            # when that is further, with no throughput
            past = max(limit * 1.02, point.predicted_bytes or 0)
            parts.append(_mark(point, min(axes.x(past / scale), right_edge), axes.y(0) - 8))
        elif point.peak_bytes is not None:
            x, y = axes.x(point.peak_bytes / scale), axes.y(point.samples_per_s or 0.0)
            parts.append(_mark(point, x, y))
            if point.chosen:
                chosen = _chosen(point, x, y)
    if chosen:
        parts.append(chosen)
    return svg.chart(axes, parts, chart_id="chart-memory", title="throughput vs peak memory")


def _best_so_far(points: list[tuple[float, Point]]) -> list[tuple[float, float]]:
    line: list[tuple[float, float]] = []
    best = None
    for x, point in points:
        if point.kind == FEASIBLE and point.samples_per_s is not None:
            if best is not None:
                line.append((x, best))
            best = point.samples_per_s if best is None else max(best, point.samples_per_s)
            line.append((x, best))
    return line


def search_progress(data: ReportData, *, by_time: bool) -> str:
    """Each probe's samples/s and the best so far, by trial number or by wall clock."""
    # probes that ran: measured ones at their samples/s, out-of-memory ones on the floor
    probed = [p for p in data.points if p.samples_per_s is not None or p.kind == INFEASIBLE]
    if by_time:
        keyed = [(p.started_s / 60, p) for p in probed if p.started_s is not None]
        x_title, chart_id = "minutes since the study's first trial", "chart-progress-time"
    else:
        keyed = [(float(p.trial), p) for p in probed]
        x_title, chart_id = "trial number", "chart-progress-trials"
    keyed.sort(key=lambda item: item[0])
    x_high = max([1.0, *[x for x, _ in keyed]])
    y_high = max([1.0, *[p.samples_per_s or 0.0 for _, p in keyed]]) * 1.12
    axes = svg.Axes(0, x_high * 1.04, 0, y_high, width=480, height=300)
    parts = axes.frame(x_title, "samples/s")
    line = _best_so_far(keyed)
    if line:
        line.append((x_high * 1.04, line[-1][1]))
        pixels = [(axes.x(x), axes.y(y)) for x, y in line]
        parts.append(svg.polyline(pixels, BEST_LINE_COLOR, css="best-so-far", width=3))
    chosen = []
    for x, point in keyed:
        rate = point.samples_per_s
        px, py = axes.x(x), axes.y(rate) if rate is not None else axes.y(0) - 8
        parts.append(_mark(point, px, py))
        if point.chosen:
            chosen.append(_chosen(point, px, py))
    parts += chosen
    return svg.chart(axes, parts, chart_id=chart_id, title="search progress")


def confirmation(data: ReportData) -> str:
    """Each contender's probes, its estimate and 95% interval, leader first."""
    verdict = data.verdict
    if verdict is None or not verdict.contenders:
        return ""
    contenders = verdict.contenders
    values = [v for c in contenders for v in c.samples_per_s]
    low = min([*values, *(c.estimate - c.half_width for c in contenders)])
    high = max([*values, *(c.estimate + c.half_width for c in contenders)])
    pad = (high - low) * 0.08 or 1.0
    row_h = 34
    axes = svg.Axes(
        low - pad, high + pad, 0, len(contenders), width=720, height=60 + row_h * len(contenders)
    )
    axes.left = _label_room([f"trial {c.trial} {c.label} (chosen)" for c in contenders])
    axes.width = axes.left + 490
    parts = axes.frame("samples/s per probe; bar: 95% interval of the estimate", "", y_ticks=False)
    for index, contender in enumerate(contenders):
        y = axes.y(len(contenders) - index - 0.5)
        chosen = (
            data.best is not None and data.best.confirmed and data.best.trial == contender.trial
        )
        name = f"trial {contender.trial} {contender.label}" + (" (chosen)" if chosen else "")
        parts.append(svg.text(axes.left - 8, y + 4, name, anchor="end"))
        lo, hi = (
            contender.estimate - contender.half_width,
            contender.estimate + contender.half_width,
        )
        tip = contender.describe()
        parts.append(
            svg.rect(
                axes.x(lo),
                y - 6,
                axes.x(hi) - axes.x(lo),
                12,
                INTERVAL_COLOR,
                tip=tip,
                css="interval",
            )
        )
        for value in contender.samples_per_s:
            parts.append(
                svg.dot(axes.x(value), y, "#555555", tip=f"{value:.1f}", css="sample", r=3)
            )
        color = CHOSEN_COLOR if chosen else FEASIBLE_COLOR
        parts.append(
            svg.line(
                axes.x(contender.estimate), y - 11, axes.x(contender.estimate), y + 11, color, 4
            )
        )
    return svg.chart(axes, parts, chart_id="chart-confirmation", title="confirmation round")


def loss_curves(data: ReportData) -> str:
    """The chosen trial's loss and its reference's, step by step (``autotune verify``); a
    loss that is not finite is a cross on the top edge."""
    import math

    check = data.loss_check
    runs = {run.role: run for run in check.runs} if check is not None else {}
    curves = [
        (runs[role], color)
        for role, color in (("reference", REFERENCE_LOSS_COLOR), ("winner", CHOSEN_LOSS_COLOR))
        if role in runs and runs[role].trace is not None
    ]
    if len(curves) < 2:
        return ""
    finite = [v for run, _ in curves for v in run.trace.losses if math.isfinite(v)]  # type: ignore[union-attr]
    low, high = (min(finite), max(finite)) if finite else (0.0, 1.0)
    pad = (high - low) * 0.1 or abs(high) * 0.01 or 1.0
    steps = max(len(run.trace.losses) for run, _ in curves)  # type: ignore[union-attr]
    axes = svg.Axes(0, max(steps - 1, 1), low - pad, high + pad, width=560, height=300)
    parts = axes.frame("optimizer step", "loss (mean over the global batch)")
    for run, color in curves:
        losses = run.trace.losses  # type: ignore[union-attr]
        points = [(axes.x(s), axes.y(v)) for s, v in enumerate(losses) if math.isfinite(v)]
        css = f"loss-{run.role}"
        parts.append(svg.polyline(points, color, css=css, width=2))
        for step, value in enumerate(losses):
            tip = f"{run.role} {run.label}, step {step}: loss {value:.6g}"
            if math.isfinite(value):
                parts.append(svg.dot(axes.x(step), axes.y(value), color, tip=tip, css=css, r=3))
            else:
                parts.append(svg.cross(axes.x(step), axes.top + 6, color, tip=tip, css=css))
    names = [(color, f"{run.role} {run.label}") for run, color in curves]
    parts += svg.legend(names, axes.left + 8, axes.top + 12)
    return svg.chart(axes, parts, chart_id="chart-loss", title="loss check")


def prediction(data: ReportData) -> str:
    """Measured against predicted peak per rank, with the line where they agree."""
    points = [p for p in data.points if p.peak_bytes and p.predicted_bytes]
    if not points:
        return ""
    unit, scale = memory_unit(data.limit_bytes)
    high = max(max(p.peak_bytes or 0, p.predicted_bytes or 0) for p in points) * 1.15 / scale
    axes = svg.Axes(0, high, 0, high, width=420, height=380)
    parts = axes.frame(f"predicted peak per rank ({unit})", f"measured peak per rank ({unit})")
    parts.append(svg.line(axes.x(0), axes.y(0), axes.x(high), axes.y(high), "#999999", 2, "4 4"))
    limit = data.limit_bytes / scale
    if limit <= high:  # a limit far above every peak would squash the points into a corner
        parts.append(
            '<g class="limit-line">'
            + svg.line(axes.x(0), axes.y(limit), axes.x(high), axes.y(limit), LIMIT_COLOR, 3, "8 4")
            + "</g>"
        )
    for point in points:
        x, y = axes.x((point.predicted_bytes or 0) / scale), axes.y((point.peak_bytes or 0) / scale)
        parts.append(_mark(point, x, y))
    return svg.chart(axes, parts, chart_id="chart-prediction", title="predicted vs measured")


def importance(data: ReportData) -> str:
    values = sorted(data.importance.values.items(), key=lambda item: item[1], reverse=True)
    if not values:
        return ""
    row_h = 28
    axes = svg.Axes(0, 1.0, 0, len(values), width=560, height=60 + row_h * len(values))
    axes.left = _label_room([name for name, _ in values])
    axes.width = axes.left + 340
    parts = axes.frame(f"importance for samples/s ({data.importance.method})", "", y_ticks=False)
    for index, (name, value) in enumerate(values):
        y = axes.y(len(values) - index - 0.5)
        parts.append(svg.text(axes.left - 8, y + 4, name, anchor="end"))
        parts.append(
            svg.rect(
                axes.x(0),
                y - 9,
                axes.x(value) - axes.x(0),
                18,
                IMPORTANCE_COLOR,
                tip=f"{name}: {value:.2f}",
                css="importance",
            )
        )
    return svg.chart(axes, parts, chart_id="chart-importance", title="parameter importance")


def legend() -> str:
    items = [
        (FEASIBLE_COLOR, "feasible"),
        (STOPPED_COLOR, "stopped early (hollow)"),
        (INFEASIBLE_COLOR, "infeasible (x)"),
        (NOT_PROBED_COLOR, "not probed: predicted peak"),
        (CHOSEN_COLOR, "chosen"),
        (LIMIT_COLOR, "memory limit"),
        (BEST_LINE_COLOR, "best so far"),
    ]
    axes = svg.Axes(0, 1, 0, 1, width=980, height=24)
    return svg.chart(axes, svg.legend(items, 4, 16), chart_id="legend", title="legend")
