"""What people read of a study: the status table, `report.html` and its charts, the notes
and figure in optuna-dashboard, and the `--json` documents."""

from autotune.views._dashboard import LOOPBACK, annotate, serve
from autotune.views._forecast_table import forecast_report
from autotune.views._html_report import REPORT_NAME, write_report
from autotune.views._json_documents import (
    dumps,
    export_document,
    forecast_document,
    loss_check_document,
    plan_document,
    space_document,
    status_document,
)
from autotune.views._status_table import (
    goal_lines,
    loss_check_lines,
    plan_report,
    space_facts,
    space_report,
    trials_table,
)

__all__ = [
    "LOOPBACK",
    "REPORT_NAME",
    "annotate",
    "dumps",
    "export_document",
    "forecast_document",
    "forecast_report",
    "goal_lines",
    "loss_check_document",
    "loss_check_lines",
    "plan_document",
    "plan_report",
    "serve",
    "space_document",
    "space_facts",
    "space_report",
    "status_document",
    "trials_table",
    "write_report",
]
