"""Predicted vs measured peak memory per rank of a user's script (script mode), 2 CPU ranks.

autotune knows a script's model only from its probes (``autotune/script_memory.py``). This
runs ``autotune run --script SCRIPT --sampler grid`` over a small space (every candidate
probed once, in the space's order; nothing is pruned under the default limit) and reads the
study back:

- **sequential**: each probe predicted from the probes before it, in the study's order,
  which is what a study acts on (none until the model has seen the candidate's shape);
- **leave-one-out**: each probe predicted from every other probe's reports.

The JSON keeps what each probe reported, so ``--report FILE`` re-predicts the peaks of an
earlier run with the current model (no probes).

Reproduce:
    python benchmarks/memory_accuracy/script_memory_accuracy.py \\
        --out benchmarks/memory_accuracy/data/script_memory_accuracy.json
    python benchmarks/memory_accuracy/script_memory_accuracy.py --scripts hf \\
        --out benchmarks/memory_accuracy/data/script_memory_accuracy_hf.json
    python benchmarks/memory_accuracy/script_memory_accuracy.py \\
        --report benchmarks/memory_accuracy/data/script_memory_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parents[1] / "examples"
SCRIPTS = {
    # name: (script, its arguments, space)
    "vision": (
        EXAMPLES / "vision_deepspeed" / "train.py",
        ["--deepspeed", "--deepspeed_config", "ds_config.json", "--epochs", "50"],
        "precision: [fp32, bf16]\nzero_stage: [0, 1, 2, 3]\nmicro_batch_size: [4, 8, 16]\n",
    ),
    "hf": (
        EXAMPLES / "hf_trainer" / "train.py",
        [
            "--deepspeed", "ds_config.json", "--output_dir", "out", "--max_steps", "1000",
            "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
            "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true",
            "--logging_strategy", "no",
        ],
        "precision: [fp32, bf16]\nzero_stage: [0, 2]\nmicro_batch_size: [2, 4, 8]\n"
        "activation_checkpointing: [false, true]\n",
    ),
}  # fmt: skip


def run_study(name: str, workdir: Path) -> Path:
    """The study of a copy of the example's folder, in ``workdir``; its database."""
    import shutil

    source, args, space = SCRIPTS[name]
    folder = workdir / name
    shutil.copytree(source.parent, folder)
    script = folder / source.name
    (folder / "space.yaml").write_text(space)
    command = [
        sys.executable, "-m", "autotune.cli", "run", "--script", str(script), "--gpus", "2",
        "--space", "space.yaml", "--sampler", "grid", "--no-confirm", "--executor", "local",
        "--budget", "2h", "--warmup-steps", "2", "--timed-steps", "3", "--max-timed-steps", "3",
        "--study", name, "--", *args,
    ]  # fmt: skip
    started = time.monotonic()
    with open(workdir / f"{name}.log", "w") as log:
        code = subprocess.run(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT)
    print(f"{name}: study in {time.monotonic() - started:.0f} s (exit {code.returncode})")
    return folder / "trials" / "autotune.db"


def collect(name: str, database: Path) -> list[dict[str, Any]]:
    """Per measured probe, in trial order: the candidate, what its ranks reported (model,
    forward activations), its measured peak and the prediction its trial recorded."""
    import optuna

    from autotune.memory import read_probe
    from autotune.study import records

    study = optuna.load_study(study_name=name, storage=f"sqlite:///{database}")
    probes = []
    for trial in records.views(study):
        if not trial.is_evaluation or trial.status != "ok":
            continue
        model, activations = read_probe(trial.record.trial_dir)
        probes.append(
            {
                "label": trial.label,
                "candidate": trial.candidate.model_dump(mode="json"),
                "model": model.model_dump() if model is not None else None,
                "activations": activations,
                "measured": trial.record.peak_bytes,
                "recorded": trial.record.predicted_peak_bytes,
            }
        )
    return probes


def predict(probes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each probe predicted by the current model: from the probes before it (sequential,
    as a study sees them) and from all the others (leave-one-out)."""
    from autotune.candidate import Candidate
    from autotune.memory import ScriptMemoryModel
    from autotune.protocol import ModelInfo

    def learned(subset: list[dict[str, Any]]) -> ScriptMemoryModel:
        model = ScriptMemoryModel("cpu")
        for probe in subset:
            info = ModelInfo.model_validate(probe["model"]) if probe["model"] else None
            candidate = Candidate.model_validate(probe["candidate"])
            model.learn_probe(candidate, "ok", info, probe["activations"], probe["measured"])
        return model

    rows = []
    for index, probe in enumerate(probes):
        candidate = Candidate.model_validate(probe["candidate"])
        row = {"label": probe["label"], "measured": probe["measured"]}
        for key, subset in (
            ("sequential", probes[:index]),
            ("leave_one_out", probes[:index] + probes[index + 1 :]),
        ):
            estimate = learned(subset).predict(candidate)
            row[key] = estimate.tracked_bytes("cpu") if estimate is not None else None
        rows.append(row)
    return rows


def summary(rows: list[dict[str, Any]], key: str) -> str:
    errors = [(r[key] - r["measured"]) / r["measured"] for r in rows if r[key]]
    if not errors:
        return f"{key}: no predictions"
    under = min(errors)
    return (
        f"{key}: {len(errors)} of {len(rows)} predicted; median |error| "
        f"{100 * statistics.median(abs(e) for e in errors):.1f}%, worst "
        f"{100 * max(abs(e) for e in errors):.1f}%, worst under-prediction "
        f"{100 * max(0.0, -under):.1f}%"
    )


def report(data: dict[str, Any]) -> None:
    for name, probes in data["scripts"].items():
        rows = predict(probes)
        print(f"\n{name}: {summary(rows, 'sequential')}; {summary(rows, 'leave_one_out')}\n")
        print("| probe | measured MiB | sequential | leave-one-out |")
        print("|---|---|---|---|")
        for row in rows:
            cells = []
            for key in ("sequential", "leave_one_out"):
                value, measured = row[key], row["measured"]
                error = 100 * (value - measured) / measured if value else 0.0
                cells.append(f"{value / 2**20:.1f} ({error:+.1f}%)" if value else "-")
            print(f"| {row['label']} | {row['measured'] / 2**20:.1f} | {cells[0]} | {cells[1]} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scripts", nargs="+", default=["vision"], choices=list(SCRIPTS))
    parser.add_argument("--out", type=Path, default=HERE / "data" / "script_memory_accuracy.json")
    parser.add_argument("--report", type=Path, help="print the tables of an earlier run")
    args = parser.parse_args()
    if args.report:
        report(json.loads(args.report.read_text()))
        return 0
    data: dict[str, Any] = {"scripts": {}}
    for name in args.scripts:
        with tempfile.TemporaryDirectory(prefix="autotune-script-memory-") as tmp:
            database = run_study(name, Path(tmp))
            data["scripts"][name] = collect(name, database)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1))
    report(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
