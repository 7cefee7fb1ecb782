"""A study written through autotune's own recording functions, with every kind of outcome.

Real probes cannot produce an out-of-memory, a candidate ruled out without a probe, a
repeated proposal, a confirmation round whose winner is not the highest single probe and a
searched global batch on demand, so this study is recorded from made-up probe results
(``records.record_probe`` and friends, the code the tuner calls) into a real SQLite study.
The tests of real probes use the study of ``real_study`` (conftest).
"""

from __future__ import annotations

from pathlib import Path

import optuna

from autotune.backends import get_backend
from autotune.candidate import Candidate
from autotune.protocol import ProbeResult
from autotune.study import best, records
from autotune.study import confirmation as confirm
from autotune.study.storage import StudyConfig, store_start

DEEPSPEED = get_backend("deepspeed")

NAME = "synthetic"
LIMIT = 64 * 2**20
MIB = 2**20

# (zero stage, micro-batch, checkpointing, overlap_comm, outcome, samples/s, peak MiB)
OUTCOMES = [
    (0, 4, False, None, "ok", 90.0, 40),
    (1, 4, False, True, "ok", 96.0, 34),  # the highest single probe; loses the round
    (1, 2, False, False, "ok", 88.0, 28),
    (0, 2, True, None, "ok", 70.0, 22),
    (0, 8, False, None, "oom", 0.0, 70),
    (1, 8, False, True, "pruned", 0.0, 0),
    (0, 1, True, None, "stopped", 52.0, 20),
    (0, 1, False, None, "ok", 60.0, 18),
]


def _candidate(stage: int, mb: int, ckpt: bool, overlap: bool | None) -> Candidate:
    return Candidate(
        precision="fp32",
        zero_stage=stage,
        micro_batch_size=mb,
        gradient_accumulation_steps=16 // (mb * 2),
        data_parallel_size=2,
        activation_checkpointing=ckpt,
        zero_knobs={"overlap_comm": overlap},
    )


def _result(outcome: str, rate: float, peak_mib: int) -> ProbeResult:
    steps = [16 / (rate * f) for f in (0.97, 1.0, 1.03)] if rate else []
    return ProbeResult(
        status="oom" if outcome == "oom" else "ok",
        error="rank 0: OutOfMemoryError: over the limit" if outcome == "oom" else "",
        samples_per_s=rate,
        samples_per_s_min=rate * 0.97,
        samples_per_s_max=rate * 1.03,
        tokens_per_s=rate * 64,
        step_time_s=16 / rate if rate else 0.0,
        step_times_s=steps,
        peak_bytes_per_rank=[peak_mib * MIB, peak_mib * MIB - MIB] if outcome != "oom" else [],
        wall_s=12.0,
        stopped_early=outcome == "stopped",
    )


def make_study(folder: Path) -> str:
    """Write the study into ``folder``/trials/autotune.db; returns its storage URL."""
    url = f"sqlite:///{folder}/trials/autotune.db"
    (folder / "trials").mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(study_name=NAME, storage=url, direction="maximize")
    config = StudyConfig(
        workload="gpt-tiny",
        space={},
        accelerator="cpu",
        gpus_per_trial=2,
        global_batch=None,  # searched: the user must rescale the learning rate
        max_global_batch=64,
        vram_limit_bytes=LIMIT,
    )
    store_start(study, config, {})
    for stage, mb, ckpt, overlap, outcome, rate, peak in OUTCOMES:
        trial = study.ask()
        trial.suggest_categorical("zero_stage", [0, 1])
        trial.suggest_categorical("micro_batch_size", [1, 2, 4, 8])
        trial.suggest_categorical("activation_checkpointing", [False, True])
        if stage >= 1:  # a conditional parameter: only where DeepSpeed reads it
            trial.suggest_categorical("overlap_comm", [False, True])
        candidate = _candidate(stage, mb, ckpt, overlap)
        record = records.TrialRecord(
            candidate=candidate,
            candidate_key=candidate.key,
            label=candidate.label,
            vram_limit_bytes=LIMIT,
            backend_config=DEEPSPEED.render_config(candidate, None),
            trial_dir=f"trials/{NAME}/trial-{trial.number:04d}",
            predicted_peak_bytes=(peak + 1) * MIB if peak else 900 * MIB,
        )
        if outcome == "pruned":
            pruned = record.model_copy(
                update={
                    "pruned_by": "memory-model",
                    "error": "predicted peak 900.00 MiB per rank exceeds the limit",
                }
            )
            records.record_pruned(study, trial, pruned, 836 * MIB)
        else:
            records.record_probe(study, trial, record, _result(outcome, rate, peak))
    # a repeated proposal of trial 0's candidate
    views = records.views(study)
    records.record_duplicate(study, study.ask(), views[0])
    verdict = confirm.Confirmation(
        contenders=[
            confirm.Contender(trial=1, label=views[1].label, samples_per_s=[96.0, 80, 82, 79]),
            confirm.Contender(trial=0, label=views[0].label, samples_per_s=[90.0, 89, 91, 90]),
            confirm.Contender(trial=2, label=views[2].label, samples_per_s=[88.0, 84, 86, 85]),
        ],
        rounds=3,
        seconds=120.0,
        after_trial=len(views),
    )
    verdict.decide()
    confirm.store(study, verdict)
    best.store(study, best.of_study(study))
    return url
