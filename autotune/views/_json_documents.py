"""``--json`` documents of ``status``, ``plan``, ``space`` and ``export``, for scripts and CI.

Each command prints one JSON object on stdout. Every document carries ``kind`` (e.g.
``"autotune.status"``) and ``version`` (:data:`VERSION`); keys are only ever added within a
version, never renamed or removed. Sizes are bytes, times seconds, rates samples/s (global).
docs/json.md lists every key.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from autotune.training_goal import TrainingGoal

if TYPE_CHECKING:
    import optuna

    from autotune.candidate import Candidate
    from autotune.export import Exported
    from autotune.memory import Planned
    from autotune.run.forecast import Forecast
    from autotune.study import Best, TrialView
    from autotune.study.loss_checks import LossCheck
    from autotune.views._status_table import SpaceFacts

VERSION = 2


def dumps(document: dict[str, Any]) -> str:
    """One JSON document, keys in the order written, ending in a newline."""
    return json.dumps(document, indent=2) + "\n"


def _head(kind: str) -> dict[str, Any]:
    return {"kind": f"autotune.{kind}", "version": VERSION}


def _candidate(candidate: Candidate) -> dict[str, Any]:
    return candidate.model_dump(mode="json")


def trial_entry(
    trial: TrialView, decided: Best | None, goal: TrainingGoal | None = None
) -> dict[str, Any]:
    """One evaluated trial of ``status --json``; with the study's ``goal``, its time and
    cost to train (null where the goal does not give them, or the trial has no value)."""
    record = trial.record
    rate = float(trial.value) if trial.state == "COMPLETE" and trial.value else 0.0
    gpus = record.candidate.data_parallel_size if record.candidate is not None else 1
    figures = (goal or TrainingGoal()).figures(rate, gpus)
    return {
        "number": trial.number,
        "state": trial.state,
        "status": trial.status,
        "label": record.label,
        "candidate": None if record.candidate is None else _candidate(record.candidate),
        "feasible": trial.feasible,
        "best": decided is not None and decided.trial == trial.number,
        "samples_per_s": trial.value if trial.state == "COMPLETE" else None,
        "samples_per_s_min": record.samples_per_s_min or None,
        "samples_per_s_max": record.samples_per_s_max or None,
        "tokens_per_s": record.tokens_per_s or None,
        "stopped_early": record.stopped_early,
        "peak_bytes": record.peak_bytes or None,
        "peak_bytes_per_rank": record.peak_bytes_per_rank,
        "predicted_peak_bytes": record.predicted_peak_bytes,
        "vram_limit_bytes": record.vram_limit_bytes,
        "host_peak_bytes_per_rank": record.host_peak_bytes_per_rank,
        "host_peak_method": record.host_peak_method if record.host_peak_bytes_per_rank else None,
        "node_per_rank": record.node_per_rank,
        "host_ram_bytes": record.host_ram_bytes or None,
        "probe_wall_s": record.probe_wall_s,
        "pruned_by": record.pruned_by,
        "error": record.error,
        "retry_of": record.retry_of,
        "trial_dir": record.trial_dir,
        **figures,
    }


def status_document(study: optuna.Study) -> dict[str, Any]:
    from autotune import training_goal
    from autotune.export import outcome_counts
    from autotune.run import read_budget
    from autotune.study import best, dropped_backends, records, screened_keys, study_config
    from autotune.study import confirmation as confirm
    from autotune.study import loss_checks as checks

    trials = records.views(study)
    evaluated = records.evaluations(trials)
    verdict = confirm.load(study)
    goal = training_goal.of_study(study)
    decided = best.decide_best(trials, verdict, checks.set_aside(study), goal)
    config = study_config(study)
    known = {t.record.candidate_key for t in evaluated}
    return {
        **_head("status"),
        "study": study.study_name,
        "goal": goal.model_dump(mode="json"),
        "config": None if config is None else config.model_dump(mode="json"),
        "dropped_backends": [d.model_dump(mode="json") for d in dropped_backends(study)],
        "budget": read_budget(study).model_dump(),
        "best": None if decided is None else decided.model_dump(),
        "confirmation": None if verdict is None else verdict.model_dump(mode="json"),
        "verification": {
            str(number): loss_check_entry(check)
            for number, check in sorted(checks.load_all(study).items())
        },
        "counts": {
            "trials": len(trials),
            "evaluated": len(evaluated),
            "duplicates": sum(1 for t in trials if t.record.duplicate_of is not None),
            "screened": len(screened_keys(study) - known),
            "outcomes": dict(sorted(outcome_counts(evaluated).items())),
        },
        "world_sizes": [
            {
                "gpus": t.candidate.data_parallel_size,
                "trial": t.number,
                "label": t.label,
                "samples_per_s": float(t.value or 0.0),
                "samples_per_s_per_gpu": float(t.value or 0.0) / t.candidate.data_parallel_size,
                **goal.figures(float(t.value or 0.0), t.candidate.data_parallel_size),
            }
            for t in records.fastest_per_world_size(trials)
        ],
        "trials": [trial_entry(t, decided, goal) for t in evaluated],
    }


def loss_check_entry(check: LossCheck) -> dict[str, Any]:
    """A trial's loss check; a loss or norm that is not finite is ``null`` (JSON has no NaN:
    the verdict's text says which it was)."""
    return _finite(check.model_dump(mode="json"))


def loss_check_document(study_name: str, check: LossCheck) -> dict[str, Any]:
    return {**_head("verify"), "study": study_name, **loss_check_entry(check)}


def _finite(value: Any) -> Any:
    """``value`` with every float that is NaN or infinite replaced by None."""
    import math

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def forecast_document(forecast: Forecast) -> dict[str, Any]:
    """``autotune plan --study S --gpus N --json``: every row, predicted or measured."""
    return {
        **_head("forecast"),
        "study": forecast.study,
        "goal": forecast.goal.model_dump(mode="json"),
        "world_sizes": forecast.world_sizes,
        "probed_world_sizes": forecast.probed_world_sizes,
        "global_batch": forecast.global_batch,
        "gpus_per_node": forecast.gpus_per_node,
        "observations": forecast.observations,
        "choice": forecast.choice,
        "notes": forecast.notes,
        "rows": [
            {
                "trial": row.trial,
                "label": row.candidate.label,
                "candidate": _candidate(row.candidate),
                "gpus": row.gpus,
                "nodes": row.nodes,
                "samples_per_s": row.samples_per_s,
                "samples_per_s_kind": "measured" if row.measured_samples_per_s else "predicted",
                "predicted_samples_per_s": row.predicted_samples_per_s,
                "measured_samples_per_s": row.measured_samples_per_s,
                "measured_error": row.error,
                "fits": row.fits,
                "why_not": row.why_not or None,
                "time_to_train_s": row.time_to_train_s,
                "cost_usd": row.cost_usd,
                "cost_basis": row.cost_basis or None,
                "finishes": row.finishes,
            }
            for row in forecast.rows
        ],
    }


def plan_document(planned: Planned) -> dict[str, Any]:
    return {
        **_head("plan"),
        "workload": planned.description,
        "params": planned.params,
        "largest_layer_params": planned.largest_layer_params,
        "gpus": planned.gpus,
        "vram_bytes": planned.vram_bytes,
        "limit_bytes": int(planned.limit_bytes),
        "margin": planned.margin,
        "host_ram_bytes": planned.host_ram_bytes,
        "global_batch": planned.global_batch,
        "fitting": sum(1 for row in planned.rows if row.fits),
        "notes": planned.notes,
        "candidates": [
            {
                "label": row.candidate.label,
                "candidate": _candidate(row.candidate),
                "fits": row.fits,
                "why_not": row.why or None,
                "device_bytes": row.device_bytes,
                "host_bytes": row.host_bytes,
                "peak_at": row.phase,
            }
            for row in planned.rows
        ],
    }


def space_document(facts: SpaceFacts) -> dict[str, Any]:
    return {
        **_head("space"),
        "space": facts.space,
        "hardware": facts.hardware,
        "gpus": facts.gpus,
        "global_batch": facts.global_batch,
        "max_global_batch": facts.max_global_batch,
        "candidates": facts.candidates,
        "dimensions": facts.dimensions,
        "notes": facts.notes,
        "dropped_backends": [d.model_dump(mode="json") for d in facts.dropped_backends],
        "examples": [{"label": c.label, "candidate": _candidate(c)} for c in facts.examples],
    }


DS_CONFIG_FILE = "ds_config.json"  # the file the export's version-1 key ds_config names


def export_document(study_name: str, exported: Exported, decided: Best | None) -> dict[str, Any]:
    """The export: ``backend_config`` is the backend's config file, whatever the backend;
    ``ds_config`` (its key since version 1) stays for a ``ds_config.json`` alone."""
    from pathlib import Path

    config_file = Path(exported.config_file)
    config = json.loads(config_file.read_text(encoding="utf-8"))
    files = {
        "backend_config": exported.config_file,
        "launch": exported.launch,
        "summary": exported.summary,
    }
    document = {
        **_head("export"),
        "study": study_name,
        "trial": exported.trial,
        "label": exported.label,
        "folder": exported.folder,
        "backend": exported.backend,
        "files": files,
        "best": None if decided is None else decided.model_dump(),
        "backend_config": config,
    }
    if config_file.name == DS_CONFIG_FILE:
        files["ds_config"] = exported.config_file
        document["ds_config"] = config
    return document
