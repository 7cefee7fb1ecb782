"""Optuna studies built from trial records, without probes."""

from __future__ import annotations

from typing import Any

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


def measured_trial(
    candidate: Any, status: str, rate: float = 0.0, **attrs
) -> optuna.trial.FrozenTrial:
    """A trial record of ``candidate`` as a probe stores it: measured at ``rate`` where
    ``status`` is ok, else pruned or failed with that status."""
    from optuna.trial import TrialState, create_trial

    user_attrs = {
        "candidate": candidate.model_dump(mode="json"),
        "candidate_key": candidate.key,
        "label": candidate.label,
        "status": status,
        "samples_per_s": rate,
        "samples_per_s_min": rate * 0.95,
        "samples_per_s_max": rate * 1.05,
        "tokens_per_s": rate * 64,
        "peak_bytes_per_rank": [2**30, 2**30],
        "host_peak_bytes_per_rank": [3 * 2**30, 3 * 2**30],
        "feasible": status == "ok",
        "error": "" if status == "ok" else f"{status} happened",
        **attrs,
    }
    if status == "ok":
        return create_trial(value=rate, user_attrs=user_attrs)
    state = TrialState.PRUNED if status in ("oom", "pruned") else TrialState.FAIL
    return create_trial(state=state, user_attrs=user_attrs)


def one_trial_study(
    workload: str,
    candidate: Any,
    *,
    accelerator: str = "cuda",
    gpus: int = 2,
    global_batch: int = 16,
    threads_per_rank: int = 4,
    script: Any = None,
) -> optuna.Study:
    """A study on ``workload`` (of ``script``, a ScriptConfig, where given) whose one trial,
    ``candidate``, measured 30 samples/s."""
    from autotune.study.storage import StudyConfig

    study = optuna.create_study(direction="maximize", study_name="one")
    config = StudyConfig(
        workload=workload,
        space={},
        accelerator=accelerator,
        gpus_per_trial=gpus,
        global_batch=global_batch,
        vram_limit_bytes=8 * 2**30,
        threads_per_rank=threads_per_rank,
        script=script,
    )
    study.set_user_attr("autotune_config", config.model_dump(mode="json"))
    study.add_trial(measured_trial(candidate, "ok", 30.0))
    return study
