"""Dump grid studies as a search-efficiency table
(``benchmarks/search_efficiency/data/table_<name>.json``).

Every candidate a grid study probed, with its throughput, step times and peak; several
studies of the same grid (repeated measurements) give one row per candidate with the median
throughput and the largest peak. On CPU the table also records this machine's matmul rate
per precision (the cost model's compute prior, as a run measures it).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from autotune.study import StudyConfig, records, stored_run_flags, study_config
from benchmarks.search_efficiency.search_efficiency_table import relative


def dump(storage: str, study_names: list[str], out: Path) -> None:
    """Write the grid studies' table; with several studies of the same grid (repeated
    measurements), each candidate's throughput is the median of its runs and its peak the
    largest, so the replay's truth carries less of one probe's noise."""
    runs: dict[str, list[dict]] = {}
    config: StudyConfig | None = None
    flags: dict[str, Any] | None = None
    for study_name in study_names:
        measured_with = add_runs(storage, study_name, runs)
        if config is not None and measured_with != config:
            raise SystemExit(f"study {study_name!r} was measured with other settings")
        config = measured_with
        flags = stored_run_flags(storage, study_name)
    assert config is not None and flags is not None
    rows = [row(label, measured) for label, measured in runs.items()]
    table = {
        "study": study_names[0] if len(study_names) == 1 else study_names,
        "workload": relative(config.workload),
        "ranks": config.gpus_per_trial,
        "global_batch": config.global_batch,
        "accelerator": config.accelerator,
        "threads_per_rank": config.threads_per_rank,
        "space": relative(flags.get("space") or "default"),
        "rows": rows,
    }
    if config.script is not None:
        table["script_params"] = script_params(storage, study_names[0])
    if config.accelerator == "cpu":
        # The cost model's compute prior per precision comes from this CPU's matmul rates
        # (a run measures them at its start; a grid run does not need them). Dump on the
        # machine that measured the table, so its replays see the same CPU.
        from autotune.run import measure_cpu_matmul_flops

        precisions = tuple(sorted({r["candidate"]["precision"] for r in rows} | {"fp32"}))
        table["cpu_matmul_flops"] = measure_cpu_matmul_flops(precisions, config.threads_per_rank)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")
    ok = [r for r in rows if r["status"] == "ok"]
    print(f"{out}: {len(rows)} candidates, {len(ok)} measured ok")


def script_params(storage: str, study_name: str) -> int:
    """The parameters of the model a script study's probes reported handing to
    ``deepspeed.initialize`` (the cost model's facts for a script: its model exists only in
    its ranks)."""
    import optuna

    from autotune.memory import read_probe

    study = optuna.load_study(study_name=study_name, storage=storage)
    for trial in records.views(study):
        model = read_probe(trial.record.trial_dir)[0] if trial.record.trial_dir else None
        if model is not None:
            return model.params
    raise SystemExit(f"no probe of script study {study_name!r} reported its model")


def add_runs(storage: str, study_name: str, runs: dict[str, list[dict]]) -> StudyConfig:
    """Append each evaluation of study ``study_name`` to ``runs`` (by candidate label);
    the settings the study measured with."""
    import optuna

    study = optuna.load_study(study_name=study_name, storage=storage)
    config = study_config(study)
    if config is None:
        raise SystemExit(f"study {study_name!r} is not a study autotune made")
    for trial in records.views(study):
        if not trial.is_evaluation or trial.status in ("interrupted", "running"):
            continue  # a repeat, or interrupted: its retry is the measurement
        runs.setdefault(trial.label, []).append(
            {**trial.record.model_dump(mode="json"), "status": trial.status}
        )
    return config


def row(label: str, measured: list[dict]) -> dict:
    """One candidate's row from its runs: the median throughput of the runs that measured
    it, unless most failed (then the first failure is the measurement)."""
    ok = [a for a in measured if a.get("status") == "ok"]
    if len(ok) * 2 < len(measured):  # mostly failed: the failure is the measurement
        first = measured[0]
        status, rate = first.get("status"), 0.0
    else:
        status, rate = "ok", statistics.median(a["samples_per_s"] for a in ok)
    return {
        "candidate": measured[0]["candidate"],
        "label": label,
        "status": status,
        "samples_per_s": rate,
        "samples_per_s_runs": [a.get("samples_per_s", 0.0) for a in measured],
        "step_times_s": [t for a in measured for t in a.get("step_times_s", [])],
        "peak_bytes": max(a.get("peak_bytes", 0) for a in measured),
        "probe_wall_s": statistics.fmean(a.get("probe_wall_s", 0.0) for a in measured),
    }
