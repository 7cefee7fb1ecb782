"""optuna-dashboard for an autotune study, with what autotune knows written where it shows.

:func:`annotate` gives every evaluated trial a note (its DeepSpeed config, predicted
against measured peak, why it was ruled out, stopped early or failed, the chosen one
marked), the study a note (the decision, the confirmation round's standings, what the
search did, and why the dashboard's "Best Trial" card may name another trial), and the
study's top page a figure of throughput against peak memory with the limit drawn.

Notes and the figure are written with optuna-dashboard's public ``save_note`` and
``save_plotly_graph_object``; a note is rewritten only when autotune's text for it changed.

:func:`serve` runs the dashboard's WSGI app on a threaded wsgiref server.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from autotune.units import format_bytes

if TYPE_CHECKING:
    import optuna

    from autotune.study import Best, Confirmation, TrialView
    from autotune.views._report_data import ReportData

FIGURE_ID = "autotune-memory"
NOTE_DIGESTS_ATTR = "autotune:note_digests"  # study system attr: each note's digest, as written
STUDY_NOTE = "study"  # the study note's key among the trial numbers in NOTE_DIGESTS_ATTR
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def trial_note(
    trial: TrialView,
    decided: Best | None,
    verdict: Confirmation | None,
    optuna_best: int | None = None,
) -> str:
    """The Markdown note of one trial (``optuna_best``: the trial the dashboard's "Best
    Trial" card and badge name)."""
    from autotune.study import records

    record = trial.record
    lines = [f"## Trial {trial.number}: {record.label}", ""]
    if decided is not None and decided.trial == trial.number:
        interval = f" ±{decided.half_width:.1f}" if decided.half_width else ""
        lines += [
            f"**★ The chosen configuration**: {decided.samples_per_s:.1f}{interval} samples/s "
            f"({decided.reason}).",
            "",
        ]
    elif decided is not None and optuna_best == trial.number:
        lines += [
            f'**Not the chosen configuration.** The "Best Trial" badge marks the highest '
            f"single measurement; autotune chose trial {decided.trial} ({decided.label}): "
            f"{decided.reason}.",
            "",
        ]
    lines += _outcome(trial)
    memory = records.readable(record).memory or "not measured"
    if record.predicted_raw_bytes is not None and record.memory_correction:
        memory += (
            f" (model {format_bytes(record.predicted_raw_bytes)} x calibration "
            f"{record.memory_correction:.2f}"
            + (f", peak in {record.predicted_phase}" if record.predicted_phase else "")
            + ")"
        )
    lines.append(f"- Memory: {memory}.")
    contenders = verdict.contenders if verdict is not None else []
    contender = next((c for c in contenders if c.trial == trial.number), None)
    if contender is not None:
        values = ", ".join(f"{v:.1f}" for v in contender.samples_per_s)
        lines.append(
            f"- Confirmation round: {contender.describe()}; each probe: {values} samples/s."
        )
    if record.trial_dir:
        lines.append(f"- Probe folder: `{record.trial_dir}`")
    if record.backend_config:
        config = json.dumps(record.backend_config, indent=2, sort_keys=True)
        from autotune.backends import get_backend

        library = get_backend(trial.candidate.backend).display_name
        lines += ["", f"{library} config of the probe:", "", "```json", config, "```"]
    return "\n".join(lines) + "\n"


def _outcome(trial: TrialView) -> list[str]:
    record = trial.record
    status = trial.status
    if record.duplicate_of is not None:
        return [
            f"- A repeated proposal of trial {record.duplicate_of}'s candidate: nothing was "
            "probed; its value and state are copies (so that the sampler does not propose it "
            "again), not a second measurement.",
        ]
    steps = (
        f"{record.samples_per_s:.1f} samples/s (steps {record.samples_per_s_min:.1f}-"
        f"{record.samples_per_s_max:.1f}), {record.tokens_per_s:.0f} tokens/s"
    )
    if trial.feasible:
        return [f"- Measured in full: {steps}."]
    if status == "ok" and record.stopped_early and record.feasible:
        return [
            f"- **Stopped early** after {len(record.step_times_s)} timed step(s): {steps}, "
            "clearly slower than the best so far. A true but short measurement: never exported.",
        ]
    if status == "ok":
        why = record.error or "its peak is above the limit"
        return [f"- **Infeasible**: {steps}, but {why}."]
    if status == "oom":
        return [f"- **Infeasible**: out of memory in the probe ({record.error})."]
    if status == "pruned":
        return [f"- **Infeasible, not probed** ({record.pruned_by}): {record.error}."]
    tail = f"\n\n```\n{record.log_tail}\n```" if record.log_tail else ""
    return [f"- **{status}**: {record.error}{tail}"]


def study_note(data: ReportData, optuna_best: int | None) -> str:
    """The Markdown note of the study: the decision and how it was reached."""
    lines = [f"# autotune: {data.study_name}", ""]
    decided = data.best
    if decided is None:
        lines.append("No feasible configuration measured in full yet: nothing to export.")
    else:
        interval = f" ±{decided.half_width:.1f}" if decided.half_width else ""
        lines += [
            f"**Chosen: trial {decided.trial}, {decided.label}**: "
            f"{decided.samples_per_s:.1f}{interval} samples/s ({decided.reason}).",
            "",
            data.distance,
        ]
        if optuna_best is not None and optuna_best != decided.trial:
            lines += [
                "",
                f'The "Best Trial" card shows trial {optuna_best}: Optuna\'s best is the '
                "highest single measurement; autotune's choice rests on the confirmation "
                "round below (repeated, interleaved probes).",
            ]
    if data.goal_lines:
        lines += ["", "## Objective, world sizes and backends", ""]
        lines += [line if line.startswith("- ") else f"- {line}" for line in data.goal_lines]
    check = data.loss_check
    if check is not None:
        lines += [
            "",
            f"**Loss check** against {check.reference_label} ({check.steps} steps from one "
            f"seed, autotune verify): {check.verdict.text}.",
        ]
    verdict = data.verdict
    if verdict is not None and verdict.contenders:
        lines += ["", "## Confirmation round", ""]
        lines += ["| # | trial | configuration | samples/s | 95% ± | probes |"]
        lines.append("| --- | --- | --- | --- | --- | --- |")
        for rank, c in enumerate(verdict.contenders, start=1):
            lines.append(
                f"| {rank} | {c.trial} | {c.label} | {c.estimate:.1f} | {c.half_width:.1f} | "
                f"{len(c.samples_per_s)} |"
            )
    lines += ["", "## Search", ""]
    lines += [f"- {reason}: {count}" for reason, count in data.outcomes.items()]
    if data.screened:
        lines.append(f"- never proposed, predicted over the limit: {data.screened}")
    if data.duplicates:
        lines.append(
            f"- {data.duplicates} repeated proposals are recorded as copies of the trial they "
            "repeat (user attr `duplicate_of`): not measurements."
        )
    if data.actions:
        lines += ["", "## What you must do in your own code", ""]
        lines += [f"- {action}" for action in data.actions]
    return "\n".join(lines) + "\n"


def figure(data: ReportData) -> dict[str, Any]:
    """A Plotly figure (as JSON data) of throughput against peak memory per rank."""
    from autotune.views import _charts as charts

    unit, scale = charts.memory_unit(data.limit_bytes)
    traces = []
    for kind, color, symbol in (
        ("feasible", charts.FEASIBLE_COLOR, "circle"),
        ("stopped early", charts.STOPPED_COLOR, "circle-open"),
        ("infeasible", charts.INFEASIBLE_COLOR, "x"),
    ):
        points = [p for p in data.points if p.kind == kind and p.peak_bytes is not None]
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": kind,
                "x": [(p.peak_bytes or 0) / scale for p in points],
                "y": [p.samples_per_s or 0.0 for p in points],
                "text": [f"trial {p.trial} {p.label}" for p in points],
                "marker": {"color": color, "size": 10, "symbol": symbol},
            }
        )
    chosen = [p for p in data.points if p.chosen and p.peak_bytes is not None]
    traces.append(
        {
            "type": "scatter",
            "mode": "markers",
            "name": "chosen",
            "x": [(p.peak_bytes or 0) / scale for p in chosen],
            "y": [p.samples_per_s or 0.0 for p in chosen],
            "text": [f"trial {p.trial} {p.label}" for p in chosen],
            "marker": {"color": charts.CHOSEN_COLOR, "size": 18, "symbol": "star"},
        }
    )
    limit = data.limit_bytes / scale
    return {
        "data": traces,
        "layout": {
            "title": {"text": f"autotune: samples/s vs peak memory per rank (limit {limit:g})"},
            "xaxis": {"title": {"text": f"peak memory per rank ({unit})"}, "rangemode": "tozero"},
            "yaxis": {"title": {"text": "samples/s"}, "rangemode": "tozero"},
            "shapes": [
                {
                    "type": "line",
                    "x0": limit,
                    "x1": limit,
                    "yref": "paper",
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": charts.LIMIT_COLOR, "dash": "dash", "width": 3},
                }
            ],
        },
    }


def annotate(study: optuna.Study, storage: optuna.storages.BaseStorage) -> int:
    """Write the notes and the figure into ``study`` (held in ``storage``); returns how many
    notes changed. A note is rewritten only when autotune's text for it changed, so an edit
    made in the dashboard stays until then."""
    import optuna
    from optuna_dashboard import save_note, save_plotly_graph_object

    from autotune.study import records
    from autotune.views._report_data import collect

    study_id = storage.get_study_id_from_name(study.study_name)
    data = collect(study)
    optuna_best = _optuna_best(study, storage)
    notes: dict[str, str] = {
        str(t.number): trial_note(t, data.best, data.verdict, optuna_best)
        for t in records.views(study)
        if t.record.candidate is not None
    }
    notes[STUDY_NOTE] = study_note(data, optuna_best)
    # Reading a note back reads every system attr of the study, once per note; the digest of
    # each note written is kept in one attr instead, read once.
    written: dict[str, str] = dict(
        storage.get_study_system_attrs(study_id).get(NOTE_DIGESTS_ATTR, {})
    )
    # save_note takes a Study or a Trial; a finished trial gets an optuna.Trial of its own
    # (Optuna's public constructor). The constructor runs the sampler's before_trial hook,
    # which may act on the trial (autotune's sampler chooses there), so the trials belong to
    # a view of the study with a RandomSampler, whose hook does nothing.
    view = optuna.load_study(
        study_name=study.study_name, storage=storage, sampler=optuna.samplers.RandomSampler()
    )
    changed = 0
    for key, body in notes.items():
        digest = hashlib.sha256(body.encode()).hexdigest()[:16]
        if written.get(key) == digest:
            continue
        if key == STUDY_NOTE:
            save_note(view, body)
        else:
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, int(key))
            save_note(optuna.Trial(view, trial_id), body)
        written[key] = digest
        changed += 1
    if changed:
        storage.set_study_system_attr(study_id, NOTE_DIGESTS_ATTR, written)
    if data.points:
        save_plotly_graph_object(view, _FigureJson(figure(data)), graph_object_id=FIGURE_ID)
    return changed


class _FigureJson:
    """A figure as ``save_plotly_graph_object`` reads it: it stores ``figure.to_json()``.
    plotly is not a dependency, so the figure is its JSON data behind that one method."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def to_json(self) -> str:
        return json.dumps(self._data)


def _optuna_best(study: optuna.Study, storage: optuna.storages.BaseStorage) -> int | None:
    """The trial optuna-dashboard's "Best Trial" card shows: the storage's best, as the
    dashboard asks for it (None when nothing completed)."""
    try:
        return storage.get_best_trial(storage.get_study_id_from_name(study.study_name)).number
    except ValueError:  # no completed trial
        return None


def serve(storage_url: str, host: str, port: int) -> None:
    """Serve optuna-dashboard on ``host:port`` until Ctrl-C."""
    import signal
    import socketserver
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from optuna_dashboard import wsgi

    from autotune.errors import SettingsError

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """No line per request."""

    class Threaded(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True

    app = wsgi(storage_url)
    try:
        server = make_server(host, port, app, server_class=Threaded, handler_class=Quiet)
    except OSError as exc:
        raise SettingsError(
            f"--port {port}: cannot listen on {host}:{port} ({exc.strerror}); pass another --port"
        ) from None
    # Ctrl-C stops it, as its first line says, even where it was started with SIGINT ignored
    # (a non-interactive shell's background job), where Python installs no handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
