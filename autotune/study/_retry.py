"""Retrying failed candidates: ``autotune run --study S --retry-failed``.

A probe that failed (``error`` or ``timeout``: a script bug, bf16 inputs the model could
not take, a hung collective) says nothing about its candidate; once the cause is fixed, the
candidate deserves its probe. Each candidate whose probes failed (or that was left unprobed
because failures stopped its precision) is queued once more (Optuna's retry: a WAITING copy
of its parameters that the next ``ask`` returns, linked to the failed trial), and the
memory screen forgets the failures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

    from autotune.study.records import TrialView

RETRIED_STATUSES = ("error", "timeout")


def retryable(trial: TrialView) -> bool:
    """A trial ``--retry-failed`` probes again: a failed probe, or a candidate left unprobed
    because its precision was stopped by probes that failed alike."""
    stopped = trial.status == "pruned" and trial.record.pruned_by.endswith(" stopped")
    return trial.is_evaluation and (trial.status in RETRIED_STATUSES or stopped)


def retried_trial(frozen: optuna.trial.FrozenTrial) -> int | None:
    """The trial an Optuna retry re-runs, if ``frozen`` is one."""
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    return RetryHeartbeatStaleTrialCallback.retried_trial_number(frozen)


def queued_retries(trials: list[TrialView]) -> set[str]:
    """Keys of the candidates whose retry is queued (a WAITING trial linked to one of their
    trials, by ``--retry-failed`` or by the retry of an interrupted probe): the search probes
    them once more instead of taking their earlier trial as their evaluation."""
    linked = {retried_trial(t.frozen) for t in trials if t.state == "WAITING"}
    return {t.record.candidate_key for t in trials if t.number in linked and t.record.candidate}


def failed_candidates(trials: list[TrialView]) -> list[TrialView]:
    """The last retried trial of each candidate no probe has measured and no retry is
    queued for yet (in trial order)."""
    measured = {t.record.candidate_key for t in trials if t.is_evaluation and t.status == "ok"}
    skipped = measured | queued_retries(trials)
    last: dict[str, TrialView] = {}
    for trial in trials:
        if retryable(trial) and trial.record.candidate_key not in skipped:
            last[trial.record.candidate_key] = trial
    return sorted(last.values(), key=lambda t: t.number)


def requeue_failed(study: optuna.Study, trials: list[TrialView]) -> list[int]:
    """Queue each failed candidate's trial once more; the numbers of those requeued. Linked
    as Optuna's own retry (``RetryFailedTrialCallback``) links a retry: ``failed_trial`` the
    first trial of the series, ``retry_history`` the series so far (the keys its
    ``retried_trial_number`` and ``retry_history`` read). None of the trial's record or
    memory constraint is carried over: the new probe writes its own."""
    import optuna
    from optuna.storages import RetryFailedTrialCallback

    requeued = []
    for trial in failed_candidates(trials):
        frozen = trial.frozen
        history = [*RetryFailedTrialCallback.retry_history(frozen), trial.number]
        study.add_trial(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState.WAITING,
                params=frozen.params,
                distributions=frozen.distributions,
                system_attrs={"failed_trial": history[0], "retry_history": history},
            )
        )
        requeued.append(trial.number)
    return requeued
