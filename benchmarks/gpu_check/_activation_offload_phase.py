"""The optional activation-offload measurement (``--activation-offload``): outside the time
plan and the verdict, after the planned phases. It runs activation_offload.py in the
check's venv and keeps what it printed, one JSON line per setting, as the report's fact
``activation_offload``; without CUDA it is skipped with the reason (CPU ranks hold host and
device in one memory). Standard library only, as the driver.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ._run import OverTime, Phase, Run

SCRIPT = str(Path(__file__).with_name("activation_offload.py"))
# GPT-2 124M twice (7 steps each) and two memory-model predictions, with room to spare
ACTIVATION_OFFLOAD_S = 180.0


def measure_activation_offload(run: Run) -> None:
    """Both settings measured and printed; nothing here passes or fails the check."""
    if not run.cuda:
        reason = "no CUDA device: host and device are one memory"
        run.facts["activation_offload"] = {"skipped": reason}
        run.say(f"activation_offload (outside the plan): skipped, {reason}")
        return
    phase = Phase(name="activation_offload", timeout_s=ACTIVATION_OFFLOAD_S)
    phase.deadline = time.monotonic() + ACTIVATION_OFFLOAD_S
    argv = [run.python, SCRIPT, "--workload", run.settings.workload, "--fraction", "0.5"]
    try:
        code, out = run.run(phase, argv, stdout_only=True)
    except OverTime as why:
        run.facts["activation_offload"] = {"error": str(why)}
        run.say(f"activation_offload (outside the plan): {why}")
        return
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    run.facts["activation_offload"] = {"exit_code": code, "rows": rows}
    for row in rows:
        run.say(
            f"activation_offload (outside the plan): {row['activation_offload']} at "
            f"checkpoint_fraction {row['checkpoint_fraction']}: peak "
            f"{row['peak_allocated_bytes'] / 2**30:.2f} GiB (predicted "
            f"{row['predicted_device_bytes'] / 2**30:.2f}, host "
            f"{row['predicted_host_bytes'] / 2**30:.2f}), step {row['step_s'] * 1e3:.0f} ms"
        )
    if code or len(rows) != 2:
        run.say(f"activation_offload (outside the plan): exit code {code}: {out[-400:]}")
