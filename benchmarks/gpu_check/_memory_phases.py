"""The GPU check's memory phases: the memory model against the allocator over the design's
candidates, under a limit set from the model's own predictions; precision and offload
judged from the same probes; and NVMe offload in a phase of its own (--nvme).

Each probes in two commands (probes.py): the predictions, in a process that ends before
any probe starts, then the probes under a limit of :data:`memory_checks.LIMIT_OVER_PREDICTION`
times the largest prediction, tight enough that a peak far above its prediction runs out of
memory or shows over the limit, not hidden by the card's size.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from ._run import PROBES, Phase, Run, Skip
from .memory_checks import limit_over_predictions, memory_checks, memory_summary
from .precision_checks import nvme_checks, precision_offload_checks
from .report import GiB

NVME_MIN_FREE_BYTES = 8 * GiB  # GPT-2's optimizer and parameter swap files with room to spare


def accelerator(run: Run) -> str:
    return "cuda" if run.cuda else "cpu"


def threads_per_rank(run: Run) -> int:
    """Each probe rank's intra-op threads: the machine's cores shared by the ranks."""
    cores = int(run.facts.get("cpu_count") or os.cpu_count() or 1)
    return max(1, cores // run.settings.probe_ranks)


def predicted(run: Run, phase: Phase, script: str, name: str, extra: list[str]) -> list[dict]:
    """The candidates of a set with the memory model's predictions (``script predict``,
    its output in ``<name>-predicted.json``)."""
    path = run.work / f"{name}-predicted.json"
    argv = [run.python, script, "predict", "--out", str(path), "--workload", run.settings.workload]
    argv += ["--accelerator", accelerator(run), "--ranks", str(run.settings.probe_ranks), *extra]
    code, out = run.run(phase, argv)
    if code or not path.exists():
        raise RuntimeError(f"the predictions failed (exit code {code}): {out[-800:]}")
    return json.loads(path.read_text())


def probe_argv(run: Run, name: str, root: str, limit_bytes: int) -> list[str]:
    """What every probing command of a phase takes: its candidates (``name``'s
    predictions), rows, folder, workload, ranks and limit."""
    device = int(run.facts.get("device_memory_bytes") or 0)
    argv = ["--candidates", str(run.work / f"{name}-predicted.json")]
    argv += ["--out", str(run.work / f"{name}.json"), "--root", str(run.work / root)]
    argv += ["--workload", run.settings.workload, "--accelerator", accelerator(run)]
    argv += ["--ranks", str(run.settings.probe_ranks), "--threads", str(threads_per_rank(run))]
    argv += ["--vram", str(limit_bytes), "--device-memory", str(device or limit_bytes)]
    return argv


def probed_rows(run: Run, phase: Phase, argv: list[str], name: str) -> list[dict[str, Any]]:
    """Run a probing command; the rows it wrote to ``<name>.json``."""
    path = run.work / f"{name}.json"
    code, out = run.run(phase, argv)
    if code or not path.exists():
        raise RuntimeError(f"exit code {code}: {out[-800:]}")
    return json.loads(path.read_text())


def ds_probe_rows(run: Run, phase: Phase, name: str, root: str, nvme: str = "") -> list[dict]:
    """The DeepSpeed candidates of ``name``'s predictions probed under their limit."""
    entries = predicted_entries(run, name)
    limit = limit_over_predictions([e["predicted_bytes"] for e in entries])
    argv = [run.python, PROBES, "memory", *probe_argv(run, name, root, limit)]
    argv += ["--timeout-s", "300", "--nvme", nvme]
    argv += ["--torch-adam"] * bool(run.facts.get("torch_adam"))
    return probed_rows(run, phase, argv, name)


def predicted_entries(run: Run, name: str) -> list[dict[str, Any]]:
    return json.loads((run.work / f"{name}-predicted.json").read_text())


def phase_memory(run: Run, phase: Phase) -> None:
    s = run.settings
    design = "full" if run.args.full_memory else "half"
    extra = ["--set", "memory", "--precisions", *s.memory_precisions, "--design", design]
    predicted(run, phase, PROBES, "memory", extra + memory_batches(run))
    rows = ds_probe_rows(run, phase, "memory", "memory")
    summary = memory_summary(rows)
    phase.data = {"workload": s.workload, "ranks": s.probe_ranks, "rows": rows}
    phase.data["vram_limit_bytes"] = rows[0]["vram_limit_bytes"] if rows else None
    phase.data["summary"] = summary
    phase.checks += memory_checks(rows, accelerator(run), min_candidates=16)
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


def memory_batches(run: Run) -> list[str]:
    return ["--micro-batches", *map(str, run.settings.memory_micro_batches)]


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


def phase_nvme(run: Run, phase: Phase) -> None:
    """ZeRO-3 with optimizer and parameters on NVMe, in a launch of its own (a disk slower
    than the plan costs this phase, not the memory table), under its own prediction's
    limit; where async I/O does not build or the disk is short, not verified with why."""
    folder = nvme_folder(run)
    rows: list[dict[str, Any]] = []
    if folder:
        extra = ["--set", "nvme", "--precisions", *run.settings.memory_precisions]
        predicted(run, phase, PROBES, "nvme", extra + memory_batches(run))
        rows = ds_probe_rows(run, phase, "nvme", "nvme-probes", nvme=folder)
    phase.data = {"rows": rows}
    phase.checks += nvme_checks(
        rows,
        nvme_expected=bool(folder),
        nvme_reason=run.facts.get("nvme_reason") or "no NVMe candidate",
        fused_adam_builds=not run.facts.get("torch_adam"),
    )
    phase.summary = "; ".join(f"{r['label']}: {r['status']}" for r in rows) or "not probed"


def phase_precision_offload(run: Run, phase: Phase) -> None:
    memory = run.phase("memory")
    rows = (memory.data.get("rows") if memory else None) or []
    if not rows:
        raise Skip("the memory phase measured nothing (its probes are this phase's)")
    phase.checks += precision_offload_checks(
        rows, accelerator(run), fused_adam_builds=not run.facts.get("torch_adam")
    )
    phase.summary = "read from the engines of the memory phase's probes"
