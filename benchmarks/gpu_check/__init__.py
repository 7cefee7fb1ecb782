"""One prepared check of every CUDA path of autotune on one GPU, in at most 9 minutes.

    bash benchmarks/gpu_check.sh OUT_DIR --wheels .gpu-wheels   # one CUDA GPU, offline node
    bash benchmarks/gpu_check.sh OUT_DIR --dry-run              # CPU ranks (CI), no GPU
    python -m benchmarks.gpu_check OUT_DIR --dry-run            # the same, from the repository root

The phases run in order, each under its own limit from one table, the time plan
(settings.py: their sum is the whole budget, 540 s on a GPU; ``--plan`` prints it, and the
run prints it first); the console shows the time each took, and a phase that fails or runs over
is recorded and the rest go on (_phases.py):

  install            a venv that sees the node's own torch, the carried wheels
                     (benchmarks/prepare_gpu_wheels.py) and autotune from this tree
  env                versions, device, driver; whether hardware detection holds a context
  ops                DeepSpeed's ops (FusedAdam, CPU Adam, async I/O), built side by side
  memory             the memory model against max_memory_allocated and _reserved over 16
                     candidates (bf16 and fp16 x ZeRO 0-3 x 2 micro-batches x checkpointing)
  precision_offload  fp16 (dynamic loss scale), bf16, optimizer offload to pinned CPU memory
                     and NVMe, from the memory phase's probes
  gpu_tests          pytest -m gpu (tests/integration/test_gpu_paths.py)
  oom                a study under a limit below ZeRO-0's need: oom recorded, the study goes
                     on, larger micro-batches ruled out, the next probe clean
  study              autotune run on GPT-2 124M (probes, confirmation, export); its budget is
                     what the phases before left, up to --study-budget
  train_export       the exported config trains 20 steps unedited, through launch.sh
                     (a dry run: 2 probes on gpt-tiny, no confirmation, 8 steps)
  study_dit          a shorter study on a DiT workload, with the time left

The study's budget is its limit less its overhead (start, export), up to --study-budget;
the DiT study is not in the GPU plan (it does not fit 9 minutes beside the rest) and is
reported not verified. The verdict is passed, failed or not verified (report.py): exit
code 0, 1 or 3.

OUT_DIR receives gpu_check.json, gpu_check.md (the table for benchmarks/RESULTS.md, with
date and device), gpu_check.log (this console), phases.log (every command and its output)
and trials.tar.gz (the studies and the probes' reports). Standard library only: it runs
before anything is installed, and never touches CUDA itself (a context here would count
as overhead in every probe).

The modules: _driver.py runs the phases and writes the report; _phases.py,
_memory_phases.py and _study_phases.py are the phases, _run.py what they run commands
through; settings.py holds each mode's limits; report.py, memory_checks.py,
oom_checks.py and study_checks.py judge what the phases read (pure functions over
data). probes.py and train.py are scripts the phases run by path in the check's venv
(they import autotune, torch and DeepSpeed); nothing here imports them.
"""

from ._driver import main
from .memory_checks import memory_checks, memory_summary, precision_offload_checks
from .oom_checks import oom_checks, oom_limit
from .report import check, render_markdown
from .settings import DRY_RUN_SETTINGS, GPU_SETTINGS, Settings
from .study_checks import (
    gpu_tests_checks,
    pytest_outcomes,
    study_checks,
    study_summary,
    train_checks,
)

__all__ = [
    "DRY_RUN_SETTINGS",
    "GPU_SETTINGS",
    "Settings",
    "check",
    "gpu_tests_checks",
    "main",
    "memory_checks",
    "memory_summary",
    "oom_checks",
    "oom_limit",
    "precision_offload_checks",
    "pytest_outcomes",
    "render_markdown",
    "study_checks",
    "study_summary",
    "train_checks",
]
