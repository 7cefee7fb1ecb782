"""The export of a study's best: the backend's config files, `launch.sh` and `summary.md`."""

from autotune.export._exporter import Exported, export, production_config
from autotune.export._summary import outcome_counts, runner_up_distance, standings, user_actions

__all__ = [
    "Exported",
    "export",
    "outcome_counts",
    "production_config",
    "runner_up_distance",
    "standings",
    "user_actions",
]
