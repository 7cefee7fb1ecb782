"""The live short studies' scoring (benchmarks/search_efficiency/short_study_live.py): each
study's export against the best of the grid passes measured around the studies, medians over
the passes."""

from __future__ import annotations

import argparse

from benchmarks.search_efficiency import short_study_live as live
from tests.support.scripted import ScriptedExecutor, make_tuner

SPACE = (
    "precision: [fp32]\nzero_stage: [0, 1]\noffload_optimizer: [none]\n"
    "offload_param: [none]\nmicro_batch_size: [4, 8]\nactivation_checkpointing: [false]\n"
)


def test_arguments_after_the_first_dash_dash_go_to_run_and_after_the_second_to_the_script():
    flags, script = live._split(
        ["--repeats", "2", "--", "--script", "t.py", "--gpus", "2", "--", "--deepspeed"]
    )
    assert script == ["--deepspeed"]
    assert flags[:2] == ["--repeats", "2"] and flags[2] == "--extra"
    assert flags[3] == '["--script", "t.py", "--gpus", "2"]'
    assert live._split(["--report", "r.json"]) == (["--report", "r.json"], [])


def test_each_export_is_scored_by_its_median_over_the_best_median_of_the_passes(
    tmp_path, capsys
) -> None:
    """Two grid passes (scripted probes, so the medians are known): z0 mb8 is the best
    (100 and 110: 105), z1 mb8 0.9 of it (90 and 99: 94.5). A study that exported z1 mb8
    scores 0.9, one of z0 mb8 1.0; one whose export the grid never measured scores None."""
    rates = {
        "z0 fp32 mb8x2": [100.0, 110.0],
        "z1 fp32 mb8x2": [90.0, 99.0],
        "z0 fp32 mb4x4": [60.0, 60.0],
        "z1 fp32 mb4x4": [50.0, 50.0],
    }
    scripted = ScriptedExecutor(rates)
    for name in ("grid-1", "grid-2"):
        tuner = make_tuner(
            tmp_path,
            SPACE,
            scripted,
            global_batch=32,
            sampler="grid",
            confirm=False,
            study_name=name,
            budget_s=600.0,
            early_stop=False,
        )
        tuner.run()
    studies = [
        {
            "study": "a",
            "export": "z1 fp32 mb8x2",
            "search_probes": 3,
            "wall_s": 240.0,
            "stopped": None,
        },
        {
            "study": "b",
            "export": "z0 fp32 mb8x2",
            "search_probes": 4,
            "wall_s": 241.0,
            "stopped": "search stopped: budget spent",
        },
        {
            "study": "c",
            "export": "z3 fp32 mb8x2",
            "search_probes": 2,
            "wall_s": 239.0,
            "stopped": None,
        },
    ]
    storage = f"sqlite:///{tmp_path}/t.db"
    assert live._complete(storage, "grid-1") and not live._complete(storage, "grid-3")
    args = argparse.Namespace(folder=tmp_path, budget="4m")
    report = live.score(
        f"sqlite:///{tmp_path}/t.db", ["grid-1", "grid-2"], studies, args, ["--gpus", "2"], []
    )
    assert report["candidates"] == 4 and report["grid_passes"] == 2
    assert report["top"][0] == {"label": "z0 fp32 mb8x2", "samples_per_s": 105.0}
    a, b, c = report["studies"]
    assert a["score"] == 0.9 and a["score_per_pass"] == [0.9, 0.9]
    assert b["score"] == 1.0 and c["score"] is None
    assert report["good_picks"] == "1/3" and report["worst_score"] == 0.9
    live.print_report(report)
    printed = capsys.readouterr().out
    assert "| a | z1 fp32 mb8x2 | 0.900 (0.900, 0.900) | 3 | 240 s |  |" in printed
    assert "good picks (>= 0.97): 1/3" in printed


def test_a_recheck_space_holds_its_one_candidate_alone() -> None:
    from autotune.candidate import Candidate
    from autotune.hardware import detect
    from autotune.space import load_space

    candidate = Candidate(
        precision="fp32",
        zero_stage=2,
        offload_optimizer="cpu",
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        data_parallel_size=2,
    )
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "one.yaml"
        path.write_text(live._one_candidate_space(candidate.model_dump(mode="json")))
        bound = load_space(str(path)).bind(detect(), data_parallel_size=2, global_batch=16)
        assert [c.key for c in bound.candidates()] == [candidate.key]
