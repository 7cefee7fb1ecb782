"""What the HTML report and the dashboard's figure show of a study, gathered once.

Every trial the study evaluated becomes a :class:`Point` (throughput, measured and
predicted peak per rank, when it ran, how it ended); the best is
:func:`autotune.study.best.decide_best`'s, the confirmation round's standings are its verdict's,
which knobs mattered comes from Optuna's importance evaluators, and the chosen trial's
loss check from :mod:`autotune.study.loss_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

    from autotune.study import Best, Confirmation, StudyConfig, TrialView
    from autotune.study.loss_checks import LossCheck

# How a trial ended, as the plots tell them apart.
FEASIBLE = "feasible"
STOPPED = "stopped early"
INFEASIBLE = "infeasible"
NOT_PROBED = "not probed"
FAILED = "failed"


@dataclass(frozen=True)
class Point:
    """One evaluated trial."""

    trial: int
    label: str
    kind: str  # FEASIBLE, STOPPED, INFEASIBLE, NOT_PROBED or FAILED
    samples_per_s: float | None  # measured (None: no measurement)
    peak_bytes: int | None  # measured worst rank
    predicted_bytes: int | None  # the memory model's calibrated prediction
    started_s: float | None  # seconds since the study's first trial started
    why: str  # why it was infeasible, stopped or failed; empty otherwise
    chosen: bool = False


@dataclass
class Importance:
    """Which knobs mattered: Optuna's importance of each parameter for samples/s."""

    values: dict[str, float] = field(default_factory=dict)
    method: str = ""
    note: str = ""  # what was left out, or why nothing could be computed


@dataclass
class ReportData:
    study_name: str
    config: StudyConfig | None
    points: list[Point]
    best: Best | None
    verdict: Confirmation | None
    chosen: TrialView | None
    importance: Importance
    outcomes: dict[str, int]
    duplicates: int
    screened: int
    distance: str
    actions: list[str]
    backend_config: dict[str, Any] | None
    loss_check: LossCheck | None = None  # the chosen trial's loss check
    # the objective, the best's time and cost to train, the fastest at each world size
    goal_lines: list[str] = field(default_factory=list)

    @property
    def limit_bytes(self) -> int:
        return self.config.vram_limit_bytes if self.config is not None else 0


def point_of(trial: TrialView, origin: float | None, chosen: int | None) -> Point:
    record = trial.record
    status = trial.status
    measured = status in ("ok", "oom") and record.peak_bytes > 0
    over = record.vram_limit_bytes and record.peak_bytes > record.vram_limit_bytes
    if trial.feasible:
        kind, why = FEASIBLE, ""
    elif status == "ok" and record.stopped_early and record.feasible:
        kind, why = STOPPED, record.pruned_by or "clearly slower than the best so far"
    elif status == "ok" and (over or not record.feasible):
        kind, why = INFEASIBLE, record.error or "measured peak above the limit"
    elif status == "oom":
        kind, why = INFEASIBLE, record.error or "out of memory"
    elif status == "pruned":
        kind, why = NOT_PROBED, record.error or record.pruned_by
    else:
        kind, why = FAILED, f"{status}: {record.error}"
    start = trial.frozen.datetime_start
    started = None if start is None or origin is None else start.timestamp() - origin
    rate = trial.value if trial.state == "COMPLETE" and trial.value is not None else None
    return Point(
        trial=trial.number,
        label=record.label,
        kind=kind,
        samples_per_s=rate,
        peak_bytes=record.peak_bytes if measured else None,
        predicted_bytes=record.predicted_peak_bytes,
        started_s=started,
        why=why,
        chosen=trial.number == chosen,
    )


def collect(study: optuna.Study) -> ReportData:
    """Everything the report shows of ``study``."""
    from autotune import training_goal
    from autotune.export import (
        outcome_counts,
        production_config,
        runner_up_distance,
        standings,
        user_actions,
    )
    from autotune.study import best, records, screened_keys, study_config
    from autotune.study import confirmation as confirm
    from autotune.study import loss_checks as checks
    from autotune.views._status_table import goal_lines

    trials = records.views(study)
    evaluated = records.evaluations(trials)
    verdict = confirm.load(study)
    goal = training_goal.of_study(study)
    decided = best.decide_best(trials, verdict, checks.set_aside(study), goal)
    config = study_config(study)
    starts = [t.frozen.datetime_start for t in evaluated if t.frozen.datetime_start is not None]
    origin = min(starts).timestamp() if starts else None
    chosen = trials[decided.trial] if decided is not None else None
    points = [point_of(t, origin, decided.trial if decided else None) for t in evaluated]
    known = {t.record.candidate_key for t in evaluated}
    return ReportData(
        study_name=study.study_name,
        config=config,
        points=points,
        best=decided,
        verdict=verdict,
        chosen=chosen,
        importance=importance(study, evaluated),
        outcomes=dict(sorted(outcome_counts(evaluated).items())),
        duplicates=sum(1 for t in trials if t.record.duplicate_of is not None),
        screened=len(screened_keys(study) - known),
        distance=runner_up_distance(
            standings(trials, verdict, decided, checks.set_aside(study), goal), verdict, goal
        ),
        actions=user_actions(chosen, config) if chosen is not None and config else [],
        backend_config=production_config(chosen, config) if chosen is not None and config else None,
        loss_check=checks.load(study, chosen.number) if chosen is not None else None,
        goal_lines=goal_lines(study),
    )


def importance(study: optuna.Study, evaluated: list[TrialView]) -> Importance:
    """Each parameter's importance for samples/s over the completed evaluations (repeated
    proposals left out: they copy another trial's value). PED-ANOVA first (no extra
    dependencies), fANOVA if that fails (needs scikit-learn). Both rate the parameters every
    trial has; a conditional one (set only in some trials, e.g. the offload ratio at ZeRO-3
    with CPU offload) is named in the note instead of rated."""
    import optuna
    from optuna.importance import (
        FanovaImportanceEvaluator,
        PedAnovaImportanceEvaluator,
        get_param_importances,
    )

    completed = [t.frozen for t in evaluated if t.state == "COMPLETE" and t.value is not None]
    if len(completed) < 3:
        return Importance(note=f"needs at least 3 completed probes; the study has {len(completed)}")
    names = sorted({name for t in completed for name in t.params})
    shared = [n for n in names if all(n in t.params for t in completed)]
    conditional = [n for n in names if n not in shared]
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    copy = optuna.create_study(direction="maximize")
    copy.add_trials(completed)
    errors = []
    for method, evaluator in (
        ("PED-ANOVA", PedAnovaImportanceEvaluator),
        ("fANOVA", FanovaImportanceEvaluator),
    ):
        try:
            values = get_param_importances(copy, evaluator=evaluator(), params=shared or None)
        except (ImportError, ValueError, RuntimeError, ZeroDivisionError) as exc:
            errors.append(f"{method}: {str(exc).splitlines()[0] if str(exc) else type(exc)}")
            continue
        note = ""
        if conditional:
            note = (
                f"conditional parameter(s) {', '.join(conditional)} are set only in some "
                "trials and are not rated"
            )
        return Importance({k: float(v) for k, v in values.items()}, method, note)
    return Importance(note="could not be computed (" + "; ".join(errors) + ")")
