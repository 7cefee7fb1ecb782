"""The study in storage: the settings it was started with, typed trial records, the
one-driver lock, the confirmation verdict, the one decision of the best, and retries."""

from autotune.study._driver_lock import STALE_S, DatabaseClock, DriverLock
from autotune.study._retry import queued_retries, requeue_failed, retried_trial, retryable
from autotune.study.best import Best
from autotune.study.confirmation import Confirmation
from autotune.study.records import TrialRecord, TrialView, ranked_feasible, trial_id, views
from autotune.study.storage import (
    StudyConfig,
    check_reachable,
    dropped_backends,
    load_existing_study,
    open_storage,
    screened_keys,
    store_dropped_backends,
    store_screened,
    store_start,
    stored_run_flags,
    study_config,
)

__all__ = [
    "STALE_S",
    "Best",
    "Confirmation",
    "DatabaseClock",
    "DriverLock",
    "StudyConfig",
    "TrialRecord",
    "TrialView",
    "check_reachable",
    "dropped_backends",
    "load_existing_study",
    "open_storage",
    "queued_retries",
    "ranked_feasible",
    "requeue_failed",
    "retried_trial",
    "retryable",
    "screened_keys",
    "store_dropped_backends",
    "store_screened",
    "store_start",
    "stored_run_flags",
    "study_config",
    "trial_id",
    "views",
]
