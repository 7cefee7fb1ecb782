"""``report.html``: one self-contained page that shows what a study found and why.

Inline CSS and inline SVG (:mod:`autotune.views._charts`), no script and no network at view time:
the file can be mailed, attached to a CI run or opened offline. It holds the decision and
how far the runner-up is, what the user must do in their own code, throughput against
peak memory with the limit, the search over probes and wall clock, the confirmation
round, predicted against measured memory, which knobs mattered, the exported config and
every trial.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.units import format_bytes
from autotune.views import _charts as charts

if TYPE_CHECKING:
    import optuna

    from autotune.views._report_data import ReportData

REPORT_NAME = "report.html"

STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1000px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; }
.sub { color: #555; margin-top: 0; }
.decision { border: 2px solid #ffb000; border-radius: 6px; padding: 10px 16px;
  background: #fffaf0; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.caption { color: #555; font-size: 13px; max-width: 960px; }
pre { background: #f6f6f6; padding: 10px; border-radius: 4px; font-size: 12px; overflow-x: auto; }
table { border-collapse: collapse; font-size: 12px; }
td, th { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: left; }
td.num { text-align: right; } td.nowrap { white-space: nowrap; }
"""


def _decision(data: ReportData) -> str:
    decided = data.best
    if decided is None:
        return (
            '<div class="decision"><b>No configuration to export yet:</b> no feasible '
            "probe measured in full.</div>"
        )
    interval = f" ±{decided.half_width:.1f}" if decided.half_width else ""
    return (
        '<div class="decision" id="decision">'
        f"<b>Chosen: trial {decided.trial}, {escape(decided.label)}</b> — "
        f"{decided.samples_per_s:.1f}{interval} samples/s: {escape(decided.reason)}.<br>"
        f"{escape(data.distance)}</div>"
    )


def _goal_section(data: ReportData) -> str:
    """The objective, the best's time and cost to train, the fastest at each world size
    (the front of GPUs, time and cost) and of each backend, where the study has them."""
    if not data.goal_lines:
        return ""
    items = "".join(f"<li>{escape(line.removeprefix('- '))}</li>" for line in data.goal_lines)
    return f'<h2>Objective, world sizes and backends</h2><ul id="goal">{items}</ul>'


def _header(data: ReportData) -> str:
    config = data.config
    what = ""
    if config is not None:
        batch = config.global_batch or f"searched (up to {config.max_global_batch})"
        device = "GPU" if config.accelerator == "cuda" else "CPU rank"
        what = (
            f"workload <code>{escape(config.workload)}</code> on {config.ranks_text} "
            f"{device}(s), global batch {escape(str(batch))}, memory limit "
            f"{format_bytes(config.vram_limit_bytes)} per rank"
        )
    return f"<h1>autotune: study {escape(data.study_name)}</h1><p class='sub'>{what}</p>"


def _actions(data: ReportData) -> str:
    if not data.actions:
        return ""
    items = "".join(f"<li>{escape(action)}</li>" for action in data.actions)
    return f'<h2>What you must do in your own code</h2><ul id="actions">{items}</ul>'


def _outcomes(data: ReportData) -> str:
    items = [f"<li>{escape(reason)}: {count}</li>" for reason, count in data.outcomes.items()]
    if data.screened:
        items.append(
            f"<li>never proposed, predicted over the limit by the memory model: "
            f"{data.screened}</li>"
        )
    if data.duplicates:
        items.append(
            f"<li>repeated proposals of an evaluated candidate (not probed again): "
            f"{data.duplicates}</li>"
        )
    return "<ul>" + "".join(items) + "</ul>"


def _trials_table(data: ReportData) -> str:
    rows = []
    for p in data.points:
        rate = f"{p.samples_per_s:.1f}" if p.samples_per_s is not None else ""
        peak = format_bytes(p.peak_bytes) if p.peak_bytes else ""
        predicted = format_bytes(p.predicted_bytes) if p.predicted_bytes else ""
        mark = " ★" if p.chosen else ""
        rows.append(
            f"<tr><td class='num nowrap'>{p.trial}{mark}</td><td class='nowrap'>"
            f"{escape(p.label)}</td><td class='nowrap'>{escape(p.kind)}</td>"
            f"<td class='num'>{rate}</td><td class='num'>{peak}</td>"
            f"<td class='num'>{predicted}</td><td>{escape(p.why[:160])}</td></tr>"
        )
    head = (
        "<tr><th>#</th><th>candidate</th><th>outcome</th><th>samples/s</th><th>peak/rank</th>"
        "<th>predicted</th><th>why</th></tr>"
    )
    return f'<table id="trials">{head}{"".join(rows)}</table>'


def _importance_section(data: ReportData) -> str:
    chart = charts.importance(data)
    note = data.importance.note
    if not chart:
        return f"<h2>Which knobs mattered</h2><p class='caption'>Not rated: {escape(note)}.</p>"
    caption = (
        f"Optuna's {escape(data.importance.method)} importance of each searched parameter for "
        "samples/s, over the completed probes." + (f" Note: {escape(note)}." if note else "")
    )
    return f"<h2>Which knobs mattered</h2>{chart}<p class='caption'>{caption}</p>"


def _loss_check_section(data: ReportData) -> list[str]:
    """The chosen trial's loss check against its reference (``autotune verify``)."""
    check = data.loss_check
    if check is None:
        return []
    return [
        "<h2>Loss check</h2>",
        f"<p id='loss-verdict'><b>{escape(check.verdict.text)}</b></p>",
        charts.loss_curves(data),
        f"<p class='caption'>The chosen configuration and its reference, "
        f"{escape(check.reference_label)} ({escape(check.reference_reason)}), trained from "
        f"seed {check.seed} on one global batch for {check.steps} optimizer step(s); the "
        "tolerance is 8·u·√(step+1) of the coarser precision's unit roundoff u.</p>",
    ]


def render(data: ReportData) -> str:
    """The whole page."""
    limit = format_bytes(data.limit_bytes)
    confirmation = charts.confirmation(data)
    prediction = charts.prediction(data)
    sections = [
        _header(data),
        _decision(data),
        _goal_section(data),
        _actions(data),
        "<h2>Throughput against peak memory per rank</h2>",
        charts.legend(),
        charts.throughput_memory(data),
        f"<p class='caption'>Every evaluated candidate: measured samples/s against its worst "
        f"rank's peak; the dashed line is the {limit} limit. Triangles on the floor were "
        "judged infeasible without a probe, at their predicted peak (clipped at the right "
        "edge when far beyond it).</p>",
        "<h2>The search over time</h2>",
        "<div class='charts'>"
        + charts.search_progress(data, by_time=False)
        + charts.search_progress(data, by_time=True)
        + "</div><p class='caption'>Each probe (out-of-memory ones on the floor); the line is "
        "the fastest feasible single probe so far, what the search steered by; the star is "
        "the configuration chosen in the end.</p>",
    ]
    if confirmation:
        sections += [
            "<h2>Confirmation round</h2>",
            confirmation,
            "<p class='caption'>The contenders were probed again, interleaved; each dot is one "
            "probe, the bar the 95% interval of its estimate, the tick the estimate.</p>",
        ]
    sections += _loss_check_section(data)
    if prediction:
        sections += [
            "<h2>Predicted against measured memory</h2>",
            prediction,
            "<p class='caption'>On the dashed diagonal the memory model was exact; above it, "
            "the model under-predicted.</p>",
        ]
    sections += [_importance_section(data), "<h2>Outcomes</h2>", _outcomes(data)]
    if data.backend_config is not None and data.chosen is not None:
        config_text = escape(json.dumps(data.backend_config, indent=2, sort_keys=True))
        from autotune.backends import get_backend

        name = get_backend(data.chosen.candidate.backend).config_file_name
        sections += [f"<h2>Exported {name}</h2>", f'<pre id="ds-config">{config_text}</pre>']
    sections += ["<h2>Every trial</h2>", _trials_table(data)]
    body = "\n".join(section for section in sections if section)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>autotune: {escape(data.study_name)}</title><style>{STYLE}</style></head>"
        f"<body>\n{body}\n</body></html>\n"
    )


def write_report(study: optuna.Study, path: Path) -> Path:
    """Render ``study``'s report into ``path``."""
    from autotune.errors import ExportError
    from autotune.views._report_data import collect

    page = render(collect(study))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ExportError(f"cannot write {path}: {exc.strerror}; pass another -o path") from None
    return path
