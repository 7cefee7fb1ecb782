"""Optuna studies built from trial records, without probes."""

from __future__ import annotations

import optuna

from autotune.study import best


def best_label(study: optuna.Study) -> str:
    decided = best.of_study(study)
    assert decided is not None
    return decided.label


def study_with(values: dict[str, list[float]], **attrs: object) -> optuna.Study:
    """One COMPLETE, feasible trial per label, with its timed steps (and ``attrs``)."""
    from autotune.candidate import Candidate

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    for index, (label, step_times) in enumerate(values.items()):
        trial = study.ask()
        rate = 16 / (sum(step_times) / len(step_times))
        candidate = Candidate(
            precision="fp32",
            zero_stage=0,
            micro_batch_size=index + 1,
            gradient_accumulation_steps=1,
            data_parallel_size=1,
        )
        for key, value in {
            "candidate": candidate.model_dump(mode="json"),
            "label": label,
            "feasible": True,
            "samples_per_s": rate,
            "step_times_s": step_times,
            "candidate_key": label,
            "status": "ok",
            "probe_wall_s": 1.0,
            **attrs,
        }.items():
            trial.set_user_attr(key, value)
        study.tell(trial, rate)
    return study
