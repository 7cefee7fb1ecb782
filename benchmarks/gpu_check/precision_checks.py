"""The GPU check's precision and offload checks, over the rows of the memory phase's probes
(benchmarks/gpu_check/probes.py), each read from what the engine did as its rank reported
it, not from the config autotune wrote: fp16 runs and its loss scale is dynamic (lowered on
overflow), bf16 runs, optimizer offload to CPU runs in page-locked (pinned) memory, and the
optimizer that stepped is the one the ops allow (FusedAdam, else torch's Adam; DeepSpeed's
CPU Adam offloaded); and over the NVMe phase's rows, NVMe offload runs and steps with
DeepSpeed's CPU Adam.

Pure functions over data, standard library only (the check's driver imports this before
anything is installed); tests/benchmarks/test_gpu_check_doctored.py feeds each a doctored
input.
"""

from __future__ import annotations

import math
from typing import Any

from .report import check, mib


def _offloads(row: dict[str, Any], device: str) -> bool:
    return device in (row.get("offload_optimizer"), row.get("offload_param"))


def precision_offload_checks(
    rows: list[dict[str, Any]], accelerator: str, *, fused_adam_builds: bool
) -> list[dict[str, Any]]:
    """fp16 (dynamic loss scale), bf16, optimizer offload to pinned CPU memory, and the
    optimizer that stepped. A kind of candidate the run should have probed and did not is
    a failure; one it could not (fp16 on CPU ranks) is not verified, with the reason."""
    on_cuda = accelerator == "cuda"
    fp16 = [r for r in rows if r["precision"] == "fp16"]
    cpu = [r for r in rows if _offloads(r, "cpu")]
    no_fp16 = "DeepSpeed's CPU accelerator refuses fp16 here (needs CUDA)"
    return [
        _ran_check("fp16 runs", fp16, expected=on_cuda, missing_reason=no_fp16),
        _loss_scale_check(fp16),
        _ran_check("bf16 runs", [r for r in rows if r["precision"] == "bf16"], expected=True),
        _ran_check("optimizer offload to CPU runs", cpu, expected=True),
        _pinned_check(cpu, on_cuda),
        _optimizer_check(rows, fused_adam_builds),
    ]


def nvme_checks(
    rows: list[dict[str, Any]], *, nvme_expected: bool, nvme_reason: str, fused_adam_builds: bool
) -> list[dict[str, Any]]:
    """The NVMe phase's probe: NVMe offload runs where async I/O builds and the disk has
    room (``nvme_expected``; elsewhere not verified with ``nvme_reason``), and it steps with
    DeepSpeed's CPU Adam."""
    nvme = [r for r in rows if _offloads(r, "nvme")]
    return [
        _ran_check("NVMe offload runs", nvme, expected=nvme_expected, missing_reason=nvme_reason),
        _optimizer_check(nvme, fused_adam_builds, expected=nvme_expected, why=nvme_reason),
    ]


def _ran_check(
    name: str, selected: list[dict[str, Any]], *, expected: bool, missing_reason: str = ""
) -> dict[str, Any]:
    """Every probe of a kind ran ``ok``; none at all fails where the run should have probed
    one (``expected``), else is not verified with ``missing_reason``."""
    if not selected:
        if expected:
            return check(name, False, "no such candidate was probed, though this run should have")
        return check(name, None, missing_reason or "no such candidate in this run")
    bad = [f"{r['label']}: {r['status']} {r.get('error', '')[:120]}" for r in selected]
    bad = [line for line, r in zip(bad, selected, strict=True) if r["status"] != "ok"]
    return check(name, not bad, "; ".join(bad) or f"{len(selected)} ran")


def _power(scale: float) -> str:
    return f"2^{math.log2(scale):g}" if scale > 0 else "none"


def _loss_scale_check(fp16: list[dict[str, Any]]) -> dict[str, Any]:
    """The fp16 engines' loss scale is dynamic, as the engines reported it: a probe whose
    scaler met overflows (skipped steps) lowered its scale. Failed where an engine held no
    scale, or skipped 2+ steps (DeepSpeed's hysteresis is 2) and kept it; not verified where
    no probe overflowed (the scaler had nothing to do)."""
    name = "fp16's loss scale is dynamic: the engine lowered it on overflow"
    measured = [r for r in fp16 if r.get("status") == "ok"]
    if not measured:
        return check(name, None, "no fp16 probe measured")

    def seen(r: dict[str, Any]) -> str:
        start, end = r.get("loss_scale_at_start") or 0, r.get("loss_scale_at_end") or 0
        return (
            f"{r['label']}: {_power(start)} -> {_power(end)}, {r.get('skipped_steps', 0)} skipped"
        )

    no_scale = [seen(r) for r in measured if not r.get("loss_scale_at_start")]
    kept = [
        seen(r)
        for r in measured
        if r.get("skipped_steps", 0) >= 2
        and (r.get("loss_scale_at_end") or 0) >= (r.get("loss_scale_at_start") or 0)
    ]
    lowered = [
        seen(r)
        for r in measured
        if 0 < (r.get("loss_scale_at_end") or 0) < (r.get("loss_scale_at_start") or 0)
    ]
    if no_scale or kept:
        why = [f"no loss scale: {line}" for line in no_scale]
        return check(name, False, "; ".join(why + [f"kept on overflow: {k}" for k in kept]))
    if not lowered:
        return check(name, None, "no fp16 probe overflowed: " + "; ".join(map(seen, measured)))
    return check(name, True, "; ".join(lowered))


def _pinned_check(cpu: list[dict[str, Any]], on_cuda: bool) -> dict[str, Any]:
    """Optimizer offload keeps its host memory page-locked, as the rank measured it while
    the engine lived: the optimizer's host tensors that ``Tensor.is_pinned()``, or the
    pinned memory PyTorch's host allocator gained since the candidate's start. A rank that
    found no host tensor of its optimizer did not offload. Judged on CUDA (CPU ranks have
    no page-locked memory to ask for)."""
    name = "offloaded optimizer memory is page-locked (pinned)"
    measured = [r for r in cpu if r.get("status") == "ok"]
    if not measured:
        return check(name, None, "no CPU offload probe measured")

    def host(r: dict[str, Any]) -> int:
        return int(r.get("offloaded_pinned_bytes") or 0) + int(
            r.get("offloaded_pageable_bytes") or 0
        )

    def gained(r: dict[str, Any]) -> int:
        return int(r.get("pinned_host_bytes_at_end") or 0) - int(
            r.get("pinned_host_bytes_at_start") or 0
        )

    def seen(r: dict[str, Any]) -> str:
        return (
            f"{r['label']}: {mib(r.get('offloaded_pinned_bytes') or 0)} of {mib(host(r))} MiB of "
            f"the optimizer's host tensors pinned, host allocator +{mib(max(gained(r), 0))} MiB"
        )

    hostless = [f"no host tensors: {r['label']}" for r in measured if not host(r)]
    if hostless:
        return check(name, False, "; ".join(hostless))
    if not on_cuda:
        return check(
            name, None, "CPU ranks, no page-locked memory: " + "; ".join(map(seen, measured))
        )
    unpinned = [
        f"not pinned: {seen(r)}"
        for r in measured
        if not r.get("pin_memory") or (not r.get("offloaded_pinned_bytes") and gained(r) <= 0)
    ]
    return check(name, not unpinned, "; ".join(unpinned or map(seen, measured)))


TORCH_OPTIMIZERS = "torch.optim."
CPU_ADAM = "DeepSpeedCPUAdam"
FUSED_ADAM = "FusedAdam"


def _expected_optimizer(row: dict[str, Any], fused_adam_builds: bool) -> str:
    """What should step ``row``'s candidate: DeepSpeed's CPU Adam with the optimizer
    offloaded (torch's Adam never replaces it, autotune.backends.deepspeed.use_torch_adam),
    else FusedAdam where it builds, else torch's (``torch.optim.`` a prefix)."""
    if row.get("offload_optimizer") in ("cpu", "nvme"):
        return CPU_ADAM
    return FUSED_ADAM if fused_adam_builds else TORCH_OPTIMIZERS


def _optimizer_check(
    rows: list[dict[str, Any]], fused_adam_builds: bool, *, expected: bool = True, why: str = ""
) -> dict[str, Any]:
    """Every probe stepped with the optimizer the ops allow, as its rank reported the
    engine's: DeepSpeed's FusedAdam where it builds, else torch's Adam (the fallback), and
    its CPU Adam with the optimizer offloaded; and the probes that fell back ran ``ok``.
    No probe at all fails where the run should have probed (``expected``)."""
    name = "the probes stepped with the optimizer the ops allow (FusedAdam, else torch's Adam)"
    fallback = "FusedAdam builds" if fused_adam_builds else "FusedAdam does not build"
    if not rows:
        return check(name, False if expected else None, f"{fallback}; no probe ran {why}".strip())
    wrong, used = [], {}
    for r in rows:
        want = _expected_optimizer(r, fused_adam_builds)
        got = r.get("optimizer") or ""
        if r.get("status") != "ok":
            if want == TORCH_OPTIMIZERS:
                wrong.append(
                    f"{r['label']} with torch's Adam: {r['status']} {r.get('error', '')[:80]}"
                )
            continue
        matches = got.startswith(want) if want == TORCH_OPTIMIZERS else got.endswith(f".{want}")
        used[got or "none reported"] = used.get(got or "none reported", 0) + 1
        if not matches:
            wrong.append(f"{r['label']}: stepped with {got or 'none reported'}, not {want}")
    ran = ", ".join(f"{k} ({v})" for k, v in sorted(used.items()))
    return check(
        name,
        bool(used) and not wrong,
        f"{fallback}; " + ("; ".join(wrong) or f"stepped with {ran}"),
    )
