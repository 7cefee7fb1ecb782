"""One prepared check of every CUDA path of autotune on one GPU, install included in at most
9 minutes.

    bash benchmarks/gpu_check/gpu_check.sh OUT_DIR --wheels .gpu-wheels  # one CUDA GPU, offline
    bash benchmarks/gpu_check/gpu_check.sh OUT_DIR --dry-run --nvme      # CPU ranks (CI), no GPU
    python -m benchmarks.gpu_check OUT_DIR --dry-run         # the same, from the repository root
    python -m benchmarks.gpu_check OUT_DIR --plan --plan-from OLD/gpu_check.json  # re-planned

What each check expects, with the number that passes it, is in docs/gpu_expectations.md
("What the GPU check judges").

The phases run in order, each under its own limit from one table, the time plan
(settings.py: their sum with the time between phases is within the budget, 540 s on a GPU,
install included; ``--plan`` prints it, and the run prints it first; ``--plan-from REPORT``
re-makes it from an earlier report's wall times, within the budget); each phase records its
wall time, and one that fails or runs over is recorded and the rest go on (_phases.py). In
the order of what they prove:

  install            a venv that sees the node's own torch, the carried wheels
                     (benchmarks/gpu_check/prepare_gpu_wheels.py) and autotune from this tree
  env                versions, device, driver; whether hardware detection holds a context
  ops                DeepSpeed's ops (FusedAdam, CPU Adam, async I/O), built side by side;
                     whether FusedAdam and async I/O build is recorded as a fact
  memory             the memory model against max_memory_allocated and _reserved over 16
                     candidates (bf16 and fp16 x ZeRO 0-3 x 2 micro-batches x checkpointing)
                     and two CPU offload ones, under a limit of 1.3x the largest prediction
  gpu_tests          pytest -m gpu over the tests of the module fixture's launches
                     (tests/integration/test_gpu_paths.py, marker gpu_check_plan); the
                     others are listed not verified, outside the plan
  oom                a study under a limit below ZeRO-0's need: oom recorded, the study goes
                     on, larger micro-batches ruled out, the next probe clean, the probes
                     that fit within the limit
  fsdp2              FSDP2 per block, CPU offload off and on, both gradient-sync modes,
                     clipping on: each peak against the memory model, each engine's
                     sharding, then the export's launch.sh trains two steps
  precision_offload  fp16 (its loss scale lowered on overflow), bf16, optimizer offload to
                     pinned CPU memory, the optimizer that stepped (FusedAdam, else torch's
                     Adam), as the memory phase's engines reported them
  study              autotune run on GPT-2 124M in the default space's DeepSpeed half
                     (benchmarks/spaces/gpu_check_study.yaml: probes, confirmation, export)
  train_export       the exported config trains 20 steps unedited, through launch.sh, with
                     the ops the ops phase built, at the study's speed (a dry run: 2 probes
                     on gpt-tiny, no confirmation, 8 steps)
  script_deepspeed   autotune run --script on examples/vision_deepspeed (a plain DeepSpeed
                     script): probes ok, activation bytes learned, an export
  script_trainer     the same on examples/hf_trainer (a Hugging Face Trainer script)
  study_dit          a shorter study on a DiT workload, where the plan gives it time
  world_size         where 2+ GPUs are present and --world-size-s gives it time: the study's
                     prediction of 2 GPUs (autotune plan --study S --gpus 2) against probes
                     at 2 of the same space and batch (one GPU: reported not verified)
  nvme               with --nvme (its time added to the budget): ZeRO-3 with optimizer and
                     parameters on NVMe, in a launch of its own
  activation_offload with --activation-offload, after the rest, outside the plan and the
                     verdict: the workload's CUDA peak and step time with its kept
                     blocks' activations on the device and on the host, at checkpoint
                     fraction 0.5, beside the memory model's (activation_offload.py);
                     skipped without CUDA

On a GPU the script phases run in the time the plan leaves (settings.if_time_left), and the
DiT study is not in the plan (it does not fit 9 minutes beside the rest). The verdict is
passed, failed or not verified (report.py): exit code 0, 1 or 3; a phase skipped, out of
time or never reached, a check not judged, a test outside the plan, and what one GPU cannot
show (2+ ranks, NCCL between ranks, probes spanning nodes) are each listed not verified
with the reason, the last in a count of their own; the report counts the checks judged
(passed or failed).

OUT_DIR receives gpu_check.json, gpu_check.md (the table for benchmarks/RESULTS.md, with
date and device), gpu_check.log (this console), phases.log (every command and its output)
and trials.tar.gz (the studies and the probes' reports). Standard library only: it runs
before anything is installed, and never touches CUDA itself (a context here would count
as overhead in every probe).

The modules: _driver.py runs the phases and writes the report; _phases.py,
_memory_phases.py, _fsdp2_phase.py, _study_phases.py, _script_phases.py and
_world_size_phase.py are the phases (_activation_offload_phase.py the optional
measurement), _run.py what they run commands through; settings.py
holds each mode's limits and the re-plan; report.py the verdict and the table;
setup_checks.py, memory_checks.py, precision_checks.py, fsdp2_checks.py, oom_checks.py and
study_checks.py make every check, judging what the phases read (pure functions over data;
tests/benchmarks/test_gpu_check_doctored.py shows each check can fail). probes.py,
fsdp2_probes.py, activation_offload.py, train.py and train_fsdp2.py are scripts the phases
run by path in the check's venv (they import autotune, torch and DeepSpeed); nothing here
imports them.
gpu_check.sh is the entry (it picks the interpreter), prepare_gpu_wheels.py makes the wheels
it carries (where PyPI answers); a report run on a GPU is committed under data/.
"""

from ._driver import main
from .fsdp2_checks import fsdp2_checks
from .memory_checks import limit_over_predictions, memory_checks, memory_summary
from .oom_checks import oom_checks, oom_limit
from .precision_checks import nvme_checks, precision_offload_checks
from .report import check, render_markdown, verdict
from .settings import DRY_RUN_SETTINGS, GPU_SETTINGS, Settings, replan
from .setup_checks import env_checks, install_checks, leftover_check, ops_checks, ops_facts
from .study_checks import (
    gpu_tests_checks,
    pytest_outcomes,
    script_checks,
    study_checks,
    study_summary,
    train_checks,
    train_speed_check,
    world_size_prediction_check,
)

__all__ = [
    "DRY_RUN_SETTINGS",
    "GPU_SETTINGS",
    "Settings",
    "check",
    "env_checks",
    "fsdp2_checks",
    "gpu_tests_checks",
    "install_checks",
    "leftover_check",
    "limit_over_predictions",
    "main",
    "memory_checks",
    "memory_summary",
    "nvme_checks",
    "oom_checks",
    "oom_limit",
    "ops_checks",
    "ops_facts",
    "precision_offload_checks",
    "pytest_outcomes",
    "render_markdown",
    "replan",
    "script_checks",
    "study_checks",
    "study_summary",
    "train_checks",
    "train_speed_check",
    "verdict",
    "world_size_prediction_check",
]
