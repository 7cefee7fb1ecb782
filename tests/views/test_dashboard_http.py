"""``autotune dashboard``: the real optuna-dashboard over HTTP, with autotune's notes on
every trial and on the study, bound to 127.0.0.1 unless asked otherwise."""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.cli import run_cli
from tests.views.conftest import (
    Dashboard,
    RealStudy,
    chromium,
    dump_dom,
    free_port,
    start_dashboard,
)
from tests.views.synthetic import NAME


def _detail(dashboard: Dashboard, name: str) -> dict[str, Any]:
    studies = requests.get(f"{dashboard.url}/api/studies", timeout=30).json()["study_summaries"]
    (summary,) = [s for s in studies if s["study_name"] == name]
    return requests.get(f"{dashboard.url}/api/studies/{summary['study_id']}", timeout=60).json()


def _notes(detail: dict[str, Any]) -> dict[int, str]:
    return {t["number"]: t["note"]["body"] for t in detail["trials"]}


def test_notes_tell_each_trial_and_the_decision(
    synthetic: str, tmp_path: Path, dashboards: list[Dashboard]
) -> None:
    dashboard = start_dashboard(synthetic, tmp_path)
    dashboards.append(dashboard)
    assert "http://127.0.0.1:" in dashboard.first_line and "Ctrl-C" in dashboard.first_line
    detail = _detail(dashboard, NAME)
    notes = _notes(detail)
    assert "★ The chosen configuration" in notes[0]
    assert "```json" in notes[0] and '"zero_optimization"' in notes[0]
    assert "predicted" in notes[0] and "% of 64.00 MiB" in notes[0]
    # trial 1 is the highest single probe, the dashboard's "Best Trial": its note says why
    # it is not the chosen one
    assert detail["best_trials"][0]["number"] == 1
    assert "Not the chosen configuration" in notes[1]
    assert "Confirmation round" in notes[1] and "each probe: 96.0, 80.0" in notes[1]
    assert "Infeasible**: out of memory" in notes[4]
    assert "Infeasible, not probed** (memory-model)" in notes[5]
    assert "Stopped early" in notes[6]
    assert "repeated proposal of trial 0" in notes[8]
    study_note = detail["note"]["body"]
    assert "**Chosen: trial 0, z0 fp32 mb4x2**" in study_note
    assert "The runner-up, trial 2" in study_note
    assert 'The "Best Trial" card shows trial 1' in study_note
    assert "rescale the learning rate" in study_note
    # the figure of throughput against memory is on the study's page
    assert [g["id"] for g in detail["plotly_graph_objects"]] == ["autotune-memory"]
    # readable memory next to the raw bytes, as columns of the trial table
    attrs = {a["key"]: a["value"] for a in detail["trials"][0]["user_attrs"]}
    assert attrs["memory"].startswith("peak 40.00 MiB per rank (62% of 64.00 MiB)")
    assert float(attrs["peak_pct_of_limit"]) == pytest.approx(62.5)
    dashboard.process.send_signal(signal.SIGINT)
    assert dashboard.process.wait(timeout=30) == 0


def test_ctrl_c_stops_a_dashboard_started_in_the_background(
    synthetic: str, tmp_path: Path, dashboards: list[Dashboard]
) -> None:
    """A non-interactive shell starts `autotune dashboard &` with SIGINT ignored; Python then
    installs no KeyboardInterrupt handler, and Ctrl-C (SIGINT) did nothing."""
    dashboard = start_dashboard(synthetic, tmp_path, sigint_ignored=True)
    dashboards.append(dashboard)
    dashboard.process.send_signal(signal.SIGINT)
    assert dashboard.process.wait(timeout=30) == 0


def test_notes_are_rewritten_only_when_they_change(synthetic: str, tmp_path: Path) -> None:
    import optuna

    from autotune.study.storage import open_storage
    from autotune.views._dashboard import annotate

    study = optuna.load_study(study_name=NAME, storage=synthetic)
    storage = open_storage(synthetic)
    assert annotate(study, storage) == 10  # nine trials and the study
    assert annotate(study, storage) == 0


def test_another_host_only_when_asked_with_a_warning(
    synthetic: str, tmp_path: Path, dashboards: list[Dashboard]
) -> None:
    dashboard = start_dashboard(synthetic, tmp_path, "--host", "0.0.0.0")
    dashboards.append(dashboard)
    assert dashboard.first_line.startswith("warning: --host 0.0.0.0: the dashboard has no login")


def test_a_port_in_use_is_one_line(synthetic: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("dashboard", "--storage", synthetic, "--port", str(port), cwd=tmp_path)
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and f"--port {port}: cannot listen" in error[0], result.stderr


@pytest.mark.slow
def test_real_study_in_the_dashboard(
    real_study: RealStudy, tmp_path: Path, dashboards: list[Dashboard]
) -> None:
    """The run itself wrote the notes (plain optuna-dashboard shows them too); the
    dashboard's own page, rendered by Chromium, shows the chosen trial's note."""
    dashboard = start_dashboard(real_study.storage, tmp_path)
    dashboards.append(dashboard)
    detail = _detail(dashboard, "gpt-tiny")
    notes = _notes(detail)
    evaluated = [
        t for t in detail["trials"] if "duplicate_of" not in {a["key"] for a in t["user_attrs"]}
    ]
    assert all(notes[t["number"]].startswith(f"## Trial {t['number']}:") for t in evaluated)
    chosen = [n for n, body in notes.items() if "★ The chosen configuration" in body]
    assert len(chosen) == 1
    assert "**Chosen: trial" in detail["note"]["body"]
    pruned = [n for n, body in notes.items() if "Infeasible, not probed" in body]
    assert pruned, "the random sampler's proposals over the limit are judged without a probe"
    chromium()
    page = f"{dashboard.url}/dashboard/studies/{detail_id(dashboard)}/trials?numbers={chosen[0]}"
    dom = dump_dom(page, wait_ms=20000)
    assert "The chosen configuration" in dom and "DeepSpeed config of the probe" in dom


def detail_id(dashboard: Dashboard) -> int:
    studies = requests.get(f"{dashboard.url}/api/studies", timeout=30).json()["study_summaries"]
    return next(s["study_id"] for s in studies if s["study_name"] == "gpt-tiny")
