"""DeepSpeed or FSDP2: the fastest of each backend a study measured, with its speed and
peak memory against the faster one's; nothing where one backend was measured."""

from __future__ import annotations

import optuna

from autotune.candidate import Candidate
from autotune.study import records
from autotune.study.backend_comparison import backend_lines, best_per_backend


def _study(
    trials: list[tuple[Candidate, float, int, bool]], stopped_early: tuple[int, ...] = ()
) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    for number, (candidate, rate, peak, feasible) in enumerate(trials):
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
            "stopped_early": number in stopped_early,
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


def test_a_backend_the_search_left_early_is_compared_by_its_first_steps() -> None:
    trials = [
        (_candidate("deepspeed", 8), 80.0, 50 * 2**20, True),
        (_candidate("fsdp2", 8), 60.0, 40 * 2**20, True),
        (_candidate("fsdp2", 4), 50.0, 30 * 2**20, True),
        (_candidate("deepspeed", 4), 70.0, 50 * 2**20, True),
    ]
    study = _study(trials, stopped_early=(1, 2, 3))
    views = records.views(study)
    # DeepSpeed has a trial measured in full; FSDP2 only partial ones: its fastest
    assert [t.number for t in best_per_backend(views)] == [0, 1]
    assert backend_lines(views)[1] == (
        "- FSDP2: fsdp2 bf16 mb8x1 reshard:yes (trial 1), 60.0 samples/s over its first steps "
        "(stopped early, clearly slower), peak 40.00 MiB per rank; 75% of DeepSpeed's speed "
        "at 0.80x its peak"
    )
    # with nothing measured in full, nothing leads: no comparison
    assert backend_lines(records.views(_study(trials, stopped_early=(0, 1, 2, 3)))) == []
