"""The GPU check's memory phases: the memory model against the allocator over the design's
candidates (and NVMe offload in a launch of its own), then precision and offload judged
from the same probes.
"""

from __future__ import annotations

import json
import shutil
from typing import Any

from ._run import PROBES, OverTime, Phase, Run, Skip
from .memory_checks import memory_checks, memory_summary
from .precision_checks import precision_offload_checks
from .report import GiB

NVME_MIN_FREE_BYTES = 8 * GiB  # GPT-2's optimizer and parameter swap files with room to spare


def phase_memory(run: Run, phase: Phase) -> None:
    s = run.settings
    device = int(run.facts.get("device_memory_bytes") or 0)
    if run.cuda:
        vram = device - 2 * GiB  # nothing should run out of memory here
    else:
        vram = min(20 * GiB, int(run.facts.get("host_memory_bytes") or 0) // 2)
    argv = [run.python, PROBES, "memory", "--root", str(run.work / "memory")]
    argv += ["--workload", s.workload, "--accelerator", "cuda" if run.cuda else "cpu"]
    argv += ["--precisions", *s.memory_precisions]
    argv += ["--micro-batches", *map(str, s.memory_micro_batches)]
    argv += ["--vram", str(vram), "--device-memory", str(device or vram), "--timeout-s", "300"]
    argv += ["--torch-adam"] * bool(run.facts.get("torch_adam"))
    design = "full" if run.args.full_memory else "half"
    nvme = nvme_folder(run)
    # a dry run probes NVMe last in the same launch (one cold start less on two cores)
    together = bool(nvme) and s.dry_run
    extras = ["--extras", "both", "--nvme", nvme] if together else ["--extras", "cpu"]
    rows = memory_rows(run, phase, [*argv, "--design", design, *extras], "memory")
    if nvme and not together:
        rows += nvme_rows(run, phase, argv, nvme)
    summary = memory_summary(rows)
    run.facts["nvme_probed"] = bool(nvme)
    phase.data = {"workload": s.workload, "vram_limit_bytes": vram, "rows": rows}
    phase.data["summary"] = summary
    phase.checks += memory_checks(rows, "cuda" if run.cuda else "cpu", min_candidates=16)
    alloc, res = summary["allocated"], summary["reserved"]
    if alloc["n"]:
        phase.summary = (
            f"{alloc['n']} candidates: median |error| {100 * alloc['median_abs']:.2f}%, worst "
            f"{100 * alloc['worst_abs']:.2f}% vs allocated"
        )
    if res["n"]:  # reported beside allocated, not judged
        phase.summary += (
            f"; vs reserved median {100 * res['median_abs']:.2f}%, "
            f"worst {100 * res['worst_abs']:.2f}%"
        )


def memory_rows(run: Run, phase: Phase, argv: list[str], name: str) -> list[dict[str, Any]]:
    path = run.work / f"{name}.json"
    code, out = run.run(phase, [*argv, "--out", str(path)])
    if code or not path.exists():
        raise RuntimeError(f"exit code {code}: {out[-800:]}")
    return json.loads(path.read_text())


def nvme_folder(run: Run) -> str:
    """The swap folder for NVMe offload, or '' (the reason kept) where it cannot run."""
    if not run.facts.get("async_io"):
        return ""
    free = shutil.disk_usage(run.work).free
    if free < NVME_MIN_FREE_BYTES:
        run.facts["nvme_reason"] = (
            f"{free / GiB:.0f} GiB free on {run.work}, under {NVME_MIN_FREE_BYTES / GiB:.0f} GiB"
        )
        return ""
    return str(run.work / "nvme")


def nvme_rows(run: Run, phase: Phase, argv: list[str], folder: str) -> list[dict[str, Any]]:
    """The NVMe candidate in a launch of its own, after the others are safe: a disk slower
    than the phase's limit costs this row, not the memory table."""
    nvme = ["--design", "none", "--extras", "nvme", "--nvme", folder]
    try:
        return memory_rows(run, phase, [*argv, *nvme], "memory-nvme")
    except OverTime as why:
        precision = run.settings.memory_precisions[0]
        return [
            {
                "label": f"z3 {precision} opt:nvme param:nvme",
                "design": False,
                "precision": precision,
                "offload_optimizer": "nvme",
                "offload_param": "nvme",
                "status": "timeout",
                "error": str(why),
                "predicted_bytes": 0,
            }
        ]


def phase_precision_offload(run: Run, phase: Phase) -> None:
    memory = run.phase("memory")
    rows = (memory.data.get("rows") if memory else None) or []
    if not rows:
        raise Skip("the memory phase measured nothing (its probes are this phase's)")
    phase.checks += precision_offload_checks(
        rows,
        "cuda" if run.cuda else "cpu",
        nvme_expected=bool(run.facts.get("nvme_probed")),
        nvme_reason=run.facts.get("nvme_reason") or "no NVMe candidate",
        fused_adam_builds=not run.facts.get("torch_adam"),
    )
    phase.summary = "read from the engines of the memory phase's probes"
