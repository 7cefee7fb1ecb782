"""The GPU check's script-mode phases: ``autotune run --script`` on the project's own
examples, unedited, a plain DeepSpeed script (examples/vision_deepspeed/) and a Hugging
Face Trainer script (examples/hf_trainer/), each a short study whose probes, learned
activation memory and export are judged (study_checks.script_checks).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from ._run import REPO, Phase, Run, Skip
from ._study_phases import PLAN_SLACK_S, cli, rank_reports, status_doc, storage
from .study_checks import script_checks, study_summary

EXAMPLES = REPO / "examples"
# A small space whose probes are short on two CPU cores and on a GPU alike (the examples'
# own end-to-end tests use it, tests/e2e/test_examples.py)
SCRIPT_SPACE = """\
# The GPU check's script studies: two precisions, ZeRO 0-1, two micro-batches.
precision: [fp32, bf16]
zero_stage: [0, 1]
micro_batch_size: [4, 8]
"""
# each script's arguments after `--`, with {folder} its copy in the work folder
SCRIPTS = {
    "script_deepspeed": (
        "vision_deepspeed",
        ["--deepspeed", "--deepspeed_config", "{folder}/ds_config.json", "--epochs", "50"],
    ),
    "script_trainer": (
        "hf_trainer",
        [
            "--deepspeed", "{folder}/ds_config.json", "--output_dir", "{folder}/out",
            "--max_steps", "1000", "--per_device_train_batch_size", "4",
            "--gradient_accumulation_steps", "2", "--report_to", "none",
            "--save_strategy", "no", "--disable_tqdm", "true", "--logging_strategy", "no",
        ],
    ),
}  # fmt: skip


def script_study(run: Run, phase: Phase) -> None:
    """``autotune run --script`` on this phase's example, a copy of it in the work folder,
    with a short budget and few probes (settings.py), then its status, reports and export."""
    s = run.settings
    budget = min(s.script_budget_s, phase.timeout_s - s.script_overhead_s)
    if budget < s.script_budget_s - PLAN_SLACK_S:
        raise Skip(f"{budget:.0f} s left for its budget, under {s.script_budget_s:.0f} s")
    phase.deadline = min(phase.deadline, time.monotonic() + budget + s.script_overhead_s)
    example, script_args = SCRIPTS[phase.name]
    folder = run.work / "scripts" / example
    shutil.copytree(EXAMPLES / example, folder, dirs_exist_ok=True)
    (folder / "space.yaml").write_text(SCRIPT_SPACE)
    study = f"gpu-check-{phase.name.replace('_', '-')}"
    argv = cli(run, "run", "--script", str(folder / "train.py"), "--gpus", "1")
    argv += ["--space", str(folder / "space.yaml"), "--budget", f"{budget:.0f}s", "--seed", "0"]
    argv += ["--max-trials", str(s.script_max_trials), "--no-confirm"]
    argv += ["--warmup-steps", "1", "--timed-steps", "2", "--max-timed-steps", "4"]
    argv += ["--executor", "local", "--quiet", "--study", study, "--storage", storage(run)]
    argv += ["--trials-dir", str(run.work / "trials")]
    argv += ["--", *(arg.format(folder=folder) for arg in script_args)]
    code, out = run.run(phase, argv, interrupt_first=True)
    status = status_doc(run, phase, study)
    export = run.work / "trials" / study / "best"
    exported = _exported(export)
    reports = rank_reports(status)
    phase.checks += script_checks(status, reports, code, exported, min_probes=s.script_min_probes)
    summary = study_summary(status)
    phase.data = {"example": example, "budget_s": budget, "study": summary}
    phase.data["run_tail"] = out[-3000:]
    phase.data["activation_bytes"] = {n: r.get("activation_bytes") for n, r in reports.items()}
    best = summary.get("best") or {}
    phase.summary = (
        f"{example}: {sum(t.get('status') == 'ok' for t in status.get('trials', []))} probe(s) "
        f"ok; best {best.get('label')} at {best.get('samples_per_s') or 0:.1f} samples/s"
    )


EXPORT_FILES = ("ds_config.json", "launch.sh", "summary.md")


def _exported(folder: Path) -> bool:
    return all((folder / name).is_file() for name in EXPORT_FILES)
