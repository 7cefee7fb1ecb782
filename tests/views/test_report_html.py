"""``autotune report``: one self-contained HTML page, rendered in headless Chromium and read
back as pixels and as the DOM the browser built (not just "the file exists")."""

from __future__ import annotations

import math
import re
from pathlib import Path

import optuna
import pytest

from autotune.study import best, records
from autotune.study import loss_checks as checks
from autotune.views import _charts as charts
from autotune.views._report_data import collect, importance
from tests.support.cli import run_cli
from tests.support.loss_checks import check
from tests.views.conftest import RealStudy, chromium, dump_dom, pixels_near, screenshot
from tests.views.synthetic import NAME


def _write(storage: str, folder: Path) -> Path:
    out = folder / "out" / "report.html"
    result = run_cli("report", "--storage", storage, "--study", NAME, "-o", str(out), cwd=folder)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"report: {out}" in result.stdout
    return out


def test_report_is_self_contained(synthetic: str, tmp_path: Path) -> None:
    page = _write(synthetic, tmp_path).read_text()
    assert "<script" not in page, "no script: the page must render without one"
    # nothing is fetched at view time: no src, no href, no CSS url(); the SVG namespace
    # (xmlns="http://www.w3.org/2000/svg") is a name, not a request
    assert not re.search(r"\s(src|href)=", page)
    assert "url(" not in page and "@import" not in page


def test_report_draws_every_chart_in_chromium(synthetic: str, tmp_path: Path) -> None:
    chromium()
    page = _write(synthetic, tmp_path)
    dom = dump_dom(page.as_uri())
    for chart_id in (
        "chart-memory",
        "chart-progress-trials",
        "chart-progress-time",
        "chart-confirmation",
        "chart-prediction",
        "chart-importance",
    ):
        assert f'id="{chart_id}"' in dom, chart_id
    # every kind of outcome has its mark; the chosen one is starred, the limit drawn
    for css in ("mark-feasible", "mark-stopped-early", "mark-infeasible", "mark-not-probed"):
        assert f'class="{css}"' in dom, css
    assert dom.count('class="mark-chosen"') == 3  # memory chart and both progress charts
    assert dom.count('class="limit-line"') >= 1
    assert dom.count('class="interval"') == 3  # three contenders
    # the decision, the distance to the runner-up and what to do in one's own code
    assert "Chosen: trial 0, z0 fp32 mb4x2" in dom
    assert "The runner-up, trial 2" in dom and "within noise" in dom
    assert "rescale the learning rate" in dom
    assert '"train_micro_batch_size_per_gpu": 4' in dom
    assert "conditional parameter(s) overlap_comm" in dom

    png = screenshot(page.as_uri(), tmp_path / "report.png")
    from PIL import Image

    image = Image.open(png).convert("RGB")
    assert len(image.getcolors(maxcolors=1 << 24) or []) > 50, "the page rendered blank"
    # the marks' colours are on screen: a filled star, dots, the limit line, the bars
    assert pixels_near(png, charts.CHOSEN_COLOR) > 300
    assert pixels_near(png, charts.FEASIBLE_COLOR) > 500
    assert pixels_near(png, charts.LIMIT_COLOR) > 200
    assert pixels_near(png, charts.INFEASIBLE_COLOR) > 30
    assert pixels_near(png, charts.INTERVAL_COLOR) > 1000
    assert pixels_near(png, charts.IMPORTANCE_COLOR) > 1000


def test_importance_names_conditional_parameters_and_needs_three_probes(synthetic: str) -> None:
    study = optuna.load_study(study_name=NAME, storage=synthetic)
    data = collect(study)
    assert data.importance.method == "PED-ANOVA"
    rated = {"zero_stage", "micro_batch_size", "activation_checkpointing"}
    assert set(data.importance.values) == rated
    assert "overlap_comm" in data.importance.note
    two = records.views(study)[:2]
    assert "at least 3 completed probes" in importance(study, two).note


@pytest.mark.slow
def test_run_writes_the_report_beside_the_export(real_study: RealStudy, tmp_path: Path) -> None:
    chromium()
    assert real_study.report.exists(), real_study.output
    assert (real_study.report.parent / "ds_config.json").exists()
    dom = dump_dom(real_study.report.as_uri())
    assert 'id="chart-memory"' in dom and 'class="mark-chosen"' in dom
    assert 'class="mark-feasible"' in dom or 'class="mark-stopped-early"' in dom
    png = screenshot(real_study.report.as_uri(), tmp_path / "real.png")
    assert pixels_near(png, charts.CHOSEN_COLOR) > 300
    assert pixels_near(png, charts.LIMIT_COLOR) > 200


def test_report_draws_the_chosen_trials_loss_check(synthetic: str, tmp_path: Path) -> None:
    """Both loss curves of the chosen trial's check (``autotune verify``), a loss that is
    not finite as a cross; nothing of it before a check."""
    (tmp_path / "before").mkdir()
    assert "Loss check" not in _write(synthetic, tmp_path / "before").read_text()
    study = optuna.load_study(study_name=NAME, storage=synthetic)
    decided = best.of_study(study)
    assert decided is not None
    checks.store(study, check(decided.trial, [8.3, 8.21, math.nan]))
    page = _write(synthetic, tmp_path).read_text()
    assert "<h2>Loss check</h2>" in page and 'id="chart-loss"' in page
    assert "<b>differs: step 2, the loss is nan" in page
    reference = re.findall(r'<(\w+) class="loss-reference"', page)
    winner = re.findall(r'<(\w+) class="loss-winner"', page)
    assert reference.count("polyline") == 1 and reference.count("circle") == 3
    assert winner.count("circle") == 2 and len(winner) == 4  # the NaN: a cross, not a dot
