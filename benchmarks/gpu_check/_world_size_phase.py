"""The GPU check's world-size phase: the study phase's fitted cost model predicts its
configurations at 2 devices (``autotune plan --study S --gpus 2``), a short study of the same
space and global batch measures them at 2 (``autotune run --gpus 2``), and each
configuration both have is compared. It runs where two devices are present and
``--world-size-s`` gives it time (one GPU cannot show it: it is reported so);
``benchmarks/world_size/world_size_prediction.py`` is the same comparison on CPU ranks.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from ._run import Phase, Run, Skip
from ._study_phases import cli, status_doc, storage
from .study_checks import world_size_prediction_check

WORLD_SIZE = 2
OVERHEAD_S = 60.0  # start, plan, the last probe, status beyond the study's budget


def phase_world_size(run: Run, phase: Phase) -> None:
    devices = int(run.facts.get("device_count") or 0)
    if run.cuda and devices < WORLD_SIZE:
        raise Skip(f"beyond one GPU: {devices} device(s) here, the comparison needs {WORLD_SIZE}")
    source = run.facts.get("studies", {}).get("study")
    if not source:
        raise Skip("the study phase left no study to predict from")
    predicted = _predicted(run, phase, source["study"])
    budget = phase.timeout_s - OVERHEAD_S
    if budget < 30:
        raise Skip(f"{budget:.0f} s left for the study at {WORLD_SIZE}, under 30 s")
    study = f"{source['study']}-{WORLD_SIZE}"
    argv = cli(run, "run", "--workload", source["workload"], "--gpus", str(WORLD_SIZE))
    argv += ["--global-batch", str(source["global_batch"]), "--budget", f"{budget:.0f}s"]
    argv += ["--space", source["space"]] * bool(source["space"])
    argv += ["--max-trials", "4", "--no-confirm", "--seed", "0", "--executor", "local"]
    argv += ["--quiet", "--study", study, "--storage", storage(run)]
    argv += ["--trials-dir", str(run.work / "trials")]
    code, out = run.run(phase, argv, interrupt_first=True)
    measured = {
        t["label"]: t["samples_per_s"]
        for t in status_doc(run, phase, study)["trials"]
        if t["feasible"] and t["samples_per_s"]
    }
    rows = [
        {"label": label, "predicted": predicted[label], "measured": rate,
         "error": predicted[label] / rate - 1}
        for label, rate in measured.items()
        if label in predicted
    ]  # fmt: skip
    phase.data = {"rows": rows, "run_exit": code, "run_tail": out[-1500:]}
    phase.checks.append(world_size_prediction_check(rows, judged=run.cuda))
    if rows:
        median = statistics.median(abs(r["error"]) for r in rows)
        phase.summary = f"median |error| {100 * median:.0f}% over {len(rows)} configuration(s)"


def _predicted(run: Run, phase: Phase, study: str) -> dict[str, float]:
    """Each configuration of ``study`` predicted at :data:`WORLD_SIZE`, by its label there."""
    argv = cli(run, "plan", "--study", study, "--gpus", str(WORLD_SIZE), "--json")
    code, out = run.run(phase, [*argv, "--storage", storage(run)], stdout_only=True)
    if code:
        raise RuntimeError(f"autotune plan --study failed (exit code {code}): {out[-500:]}")
    rows: list[dict[str, Any]] = json.loads(out)["rows"]
    return {r["label"]: r["predicted_samples_per_s"] for r in rows if r["gpus"] == WORLD_SIZE}
