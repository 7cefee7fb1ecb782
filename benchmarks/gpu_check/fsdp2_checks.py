"""The GPU check's FSDP2 checks, over the rows benchmarks/gpu_check/fsdp2_probes.py writes:
every candidate ran (per block, CPU offload off and on, gradients reduced after every
micro-batch or only at the last, clipping on), each engine sharded as asked and reduced as
asked (as its ranks read its FSDP2 states), and each peak against the memory model's
prediction (``backends/fsdp2/_memory.py`` through ``MemoryModel``).

Pure functions over data, standard library only (the check's driver imports this before
anything is installed); tests/benchmarks/test_gpu_check_doctored.py feeds each a doctored
input.
"""

from __future__ import annotations

from typing import Any

from .report import check, mib, relative_error

# benchmarks/memory_accuracy/memory_accuracy.py's targets for language models, which FSDP2's
# model meets on CPU ranks (benchmarks/RESULTS.md, "FSDP2's memory model"): the worst
# |error| and the worst under-prediction (the memory screen's risk: a candidate kept that
# runs out)
FSDP2_TARGET_WORST = 0.15
FSDP2_TARGET_UNDER = 0.05
# every pair of (CPU offload, reduced after every micro-batch) the phase probes
SETTINGS = [(offload, each) for offload in (False, True) for each in (False, True)]


def _setting(row: dict[str, Any]) -> tuple[bool, bool]:
    return bool(row.get("cpu_offload")), bool(row.get("sync_each_micro_batch"))


def _measured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("status") == "ok"]


def fsdp2_summary(rows: list[dict[str, Any]]) -> str:
    """Each candidate's peak against its prediction, in short."""
    parts = []
    for r in _measured(rows):
        error = relative_error(r["predicted_bytes"], r["allocated_bytes"])
        parts.append(f"{r['label']}: {100 * (error or 0):+.1f}%")
    return f"{len(_measured(rows))} of {len(rows)} ran; vs the model: " + ", ".join(parts)


def fsdp2_checks(rows: list[dict[str, Any]], accelerator: str) -> list[dict[str, Any]]:
    """Every FSDP2 candidate ran, sharded and reduced as asked; the model's worst error and
    worst under-prediction within their targets (CUDA's allocated peak, or the CPU ranks'
    tracked bytes, which the model predicts as exactly)."""
    return [
        _ran_check(rows),
        _sharding_check(rows, accelerator),
        _sync_check(rows),
        _worst_error_check(rows),
        _under_check(rows),
    ]


def _ran_check(rows: list[dict[str, Any]]) -> dict[str, Any]:
    name = (
        "every FSDP2 candidate ran: per block, CPU offload off and on, reduced after every "
        "micro-batch and only at the last, clipping on"
    )
    problems = [
        f"{r['label']}: {r['status']} {(r.get('error') or '')[:160]}"
        for r in rows
        if r.get("status") != "ok"
    ]
    problems += [
        f"{r['label']}: wrapped {r.get('wrap')}, clipping {r.get('gradient_clipping')}"
        for r in rows
        if r.get("wrap") != "block" or not r.get("gradient_clipping")
    ]
    missing = [s for s in SETTINGS if s not in {_setting(r) for r in rows}]
    problems += [f"no candidate with CPU offload {o}, reduced after each {e}" for o, e in missing]
    return check(name, not problems, "; ".join(problems) or f"{len(rows)} ran")


def _sharding_check(rows: list[dict[str, Any]], accelerator: str) -> dict[str, Any]:
    """Each rank's engine: one unit per block and the root, CPUOffloadPolicy where the
    candidate offloads (its shards on the host) and none where it does not (its shards on
    the device)."""
    name = "fully_shard sharded every block and the root with the offload asked (each rank)"
    measured = _measured(rows)
    if not measured:
        return check(name, None, "no FSDP2 candidate measured")
    device = "cuda" if accelerator == "cuda" else "cpu"
    wrong = []
    for r in measured:
        offload = bool(r.get("cpu_offload"))
        want = {
            "units": r.get("expected_units"),
            "offload": "CPUOffloadPolicy" if offload else "OffloadPolicy",
            "shard_device": "cpu" if offload else device,
        }
        states = r.get("sharding") or [None]
        for rank, state in enumerate(states):
            got = {key: (state or {}).get(key) for key in want}
            if got != want:
                wrong.append(f"{r['label']} rank {rank}: {got}, not {want}")
    seen = ", ".join(f"{r['label']}: {r['expected_units']} units" for r in measured)
    return check(name, not wrong, "; ".join(wrong) or seen)


def _sync_check(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each rank's first micro-batch of a step left gradient shards (reduced at once)
    exactly where the candidate reduces after every micro-batch."""
    name = (
        "gradients reduced as asked: after every micro-batch, or only at the last "
        "(the first micro-batch's gradients, each rank)"
    )
    measured = _measured(rows)
    if not measured:
        return check(name, None, "no FSDP2 candidate measured")
    wrong = [
        f"{r['label']} rank {rank}: first micro-batch reduced "
        f"{(state or {}).get('first_micro_batch_reduced')}"
        for r in measured
        for rank, state in enumerate(r.get("sharding") or [None])
        if (state or {}).get("first_micro_batch_reduced") is not bool(r["sync_each_micro_batch"])
    ]
    return check(name, not wrong, "; ".join(wrong) or f"{len(measured)} candidates as asked")


def _errors(rows: list[dict[str, Any]]) -> list[tuple[str, float]]:
    found = []
    for r in _measured(rows):
        error = relative_error(r["predicted_bytes"], r["allocated_bytes"])
        found.append((r["label"], float("inf") if error is None else error))
    return found


def _shown(rows: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"{r['label']}: {mib(r['predicted_bytes'])} MiB predicted, "
        f"{mib(r['allocated_bytes'])} measured"
        for r in _measured(rows)
    )


def _worst_error_check(rows: list[dict[str, Any]]) -> dict[str, Any]:
    name = f"FSDP2's peak within {FSDP2_TARGET_WORST:.0%} of the memory model (worst |error|)"
    errors = _errors(rows)
    if not errors:
        return check(name, None, "no FSDP2 candidate measured")
    label, worst = max(errors, key=lambda item: abs(item[1]))
    ok = abs(worst) <= FSDP2_TARGET_WORST
    return check(name, ok, f"worst {label}: {100 * worst:+.1f}%; " + _shown(rows))


def _under_check(rows: list[dict[str, Any]]) -> dict[str, Any]:
    name = f"no FSDP2 peak above its prediction by more than {FSDP2_TARGET_UNDER:.0%}"
    errors = _errors(rows)
    if not errors:
        return check(name, None, "no FSDP2 candidate measured")
    under = [(label, -e) for label, e in errors if e < -FSDP2_TARGET_UNDER]
    detail = "; ".join(f"{label}: {100 * u:.1f}% under" for label, u in under)
    return check(name, not under, detail or "none")
