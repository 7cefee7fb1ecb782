"""DeepSpeed or FSDP2: the fastest of each backend a study measured, with its speed and
peak memory against the faster one's; nothing where one backend was measured."""

from __future__ import annotations

import optuna

from autotune.candidate import Candidate
from autotune.study import records
from autotune.study.backend_comparison import backend_lines, best_per_backend


def _study(trials: list[tuple[Candidate, float, int, bool]]) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    for candidate, rate, peak, feasible in trials:
        trial = study.ask()
        attrs = {
            "candidate": candidate.model_dump(mode="json"),
            "label": candidate.label,
            "feasible": feasible,
            "samples_per_s": rate,
            "step_times_s": [16 / rate] * 3,
            "candidate_key": candidate.key,
            "status": "ok",
            "peak_bytes_per_rank": [peak, peak // 2],
        }
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        study.tell(trial, rate)
    return study


def _candidate(backend: str, micro_batch: int) -> Candidate:
    return Candidate(
        backend=backend,  # type: ignore[arg-type]
        precision="bf16",
        zero_stage=3 if backend == "fsdp2" else 1,
        micro_batch_size=micro_batch,
        gradient_accumulation_steps=8 // micro_batch,
        data_parallel_size=2,
    )


def test_the_fastest_of_each_backend_side_by_side() -> None:
    study = _study(
        [
            (_candidate("deepspeed", 4), 50.0, 400 * 2**20, True),
            (_candidate("deepspeed", 8), 60.0, 800 * 2**20, True),
            (_candidate("fsdp2", 4), 40.0, 200 * 2**20, True),
            (_candidate("fsdp2", 8), 90.0, 100 * 2**20, False),  # over the limit
        ]
    )
    trials = records.views(study)
    assert [t.number for t in best_per_backend(trials)] == [1, 2]
    assert backend_lines(trials) == [
        "- DeepSpeed: z1 bf16 mb8x1 (trial 1), 60.0 samples/s, peak 800.00 MiB per rank; "
        "the faster backend",
        "- FSDP2: fsdp2 bf16 mb4x2 reshard:yes (trial 2), 40.0 samples/s, peak 200.00 MiB per "
        "rank; 67% of DeepSpeed's speed at 0.25x its peak",
    ]


def test_one_backend_says_nothing() -> None:
    study = _study([(_candidate("fsdp2", 4), 40.0, 2**20, True)])
    assert backend_lines(records.views(study)) == []
