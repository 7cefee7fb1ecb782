"""The GPU check's FSDP2 phase: ``fully_shard`` per block with CPU offload off and on and
both gradient-sync modes, gradient clipping on, probed through autotune's FSDP2 backend
(fsdp2_probes.py, as the memory phase probes DeepSpeed's) under a limit set from the memory
model's predictions; each peak against its prediction, each engine's sharding as its ranks
read it; then the export's ``launch.sh`` trains two steps with a plain-torch script
(train_fsdp2.py). On one GPU the probes run on one rank, in a dry run on two CPU ranks
(gloo), where every check means what it means on a GPU.
"""

from __future__ import annotations

from ._memory_phases import accelerator, predicted, probe_argv, probed_rows
from ._run import REPO, Phase, Run
from .fsdp2_checks import fsdp2_checks, fsdp2_summary
from .memory_checks import limit_over_predictions
from .study_checks import train_checks

FSDP2_PROBES = str(REPO / "benchmarks" / "gpu_check" / "fsdp2_probes.py")
TRAIN_FSDP2 = str(REPO / "benchmarks" / "gpu_check" / "train_fsdp2.py")
TRAIN_STEPS = 2  # optimizer steps of the export's training


def phase_fsdp2(run: Run, phase: Phase) -> None:
    s = run.settings
    extra = ["--precision", s.memory_precisions[0], "--micro-batch", str(s.fsdp2_micro_batch)]
    entries = predicted(run, phase, FSDP2_PROBES, "fsdp2", extra)
    limit = limit_over_predictions([e["predicted_bytes"] for e in entries])
    export = run.work / "fsdp2-export"
    argv = [run.python, FSDP2_PROBES, "probe", *probe_argv(run, "fsdp2", "fsdp2", limit)]
    argv += ["--timeout-s", "300", "--export", str(export)]
    rows = probed_rows(run, phase, argv, "fsdp2")
    phase.data = {"workload": s.workload, "vram_limit_bytes": limit, "rows": rows}
    phase.checks += fsdp2_checks(rows, accelerator(run))
    # the export's launch.sh under torchrun (the script reads --fsdp2_config), in the
    # check's environment (its PATH: torchrun)
    train = ["bash", str(export / "launch.sh"), TRAIN_FSDP2, "--workload", s.workload]
    code, out = run.run(
        phase, [*train, "--steps", str(TRAIN_STEPS)], env={**run.env, "LAUNCHER": "torchrun"}
    )
    checks, data = train_checks(out, code, TRAIN_STEPS)
    phase.checks += checks
    phase.data["train"] = {**data, "exit_code": code, "tail": out[-1500:]}
    phase.summary = fsdp2_summary(rows) + f"; the export trained {data.get('global_steps')} steps"
