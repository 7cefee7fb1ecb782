"""What a space keeps on a machine: DeepSpeed's validity rules and the filters of binding.

Pure functions over the values a space lists; :meth:`autotune.space.SpaceSpec.bind` calls
them in turn. Each returns what it keeps and appends a note for what it drops, or raises
:class:`~autotune.errors.SpaceError` (one line) when nothing is left.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, get_args

from autotune.candidate import BackendName
from autotune.errors import SpaceError
from autotune.space._dropped_backend import DroppedBackend

if TYPE_CHECKING:
    from autotune.hardware import Hardware


def combination_problem(zero_stage: int, offload_optimizer: str, offload_param: str) -> str | None:
    """Why a combination is invalid in DeepSpeed, or None when it is valid.

    DeepSpeed offloads optimizer states to CPU from ZeRO-1 on (ZeRO-Offload), to NVMe and
    parameters only at ZeRO-3 (ZeRO-Infinity; at stages 1-2 DeepSpeed 0.19 quietly treats
    NVMe optimizer offload as CPU offload); see DeepSpeed's config-json docs,
    "zero_optimization". Partial offload (ratio < 1) is ZeRO-3 with CPU offload only
    (DeepSpeed asserts it in ``DeepSpeedZeroConfig.offload_ratio_check``); that rule is in
    ``BoundSpace._decide``.
    """
    if offload_optimizer == "nvme" and zero_stage != 3:
        return "offload_optimizer 'nvme' needs zero_stage 3 (at 1-2 DeepSpeed offloads to CPU)"
    if offload_optimizer != "none" and zero_stage < 1:
        return f"offload_optimizer {offload_optimizer!r} needs zero_stage 1, 2 or 3"
    if offload_param != "none" and zero_stage != 3:
        return f"offload_param {offload_param!r} needs zero_stage 3"
    return None


def keep_backends(
    listed: list[str], unavailable: Mapping[str, str], notes: list[str]
) -> tuple[list[str], list[DroppedBackend]]:
    """The listed training backends this study can train with, and those it cannot
    (``unavailable``: a backend's name to why, for every backend known), each with its
    reason; nothing left is a SpaceError naming the backends that could take their place."""
    dropped = [DroppedBackend(backend=b, reason=unavailable[b]) for b in listed if b in unavailable]
    kept = [b for b in listed if b not in unavailable]
    if not kept:
        others = [b for b in get_args(BackendName) if b not in listed and b not in unavailable]
        fix = f"add {' or '.join(others)} to 'backend'" if others else "nor with any other"
        raise SpaceError(
            f"space lists backend [{', '.join(listed)}] only, and this study cannot train with "
            + "; ".join(f"{d.backend}: {d.reason}" for d in dropped)
            + f"; {fix}"
        )
    notes += [d.line for d in dropped]
    return kept, dropped


def keep_precisions(listed: list[str], hardware: Hardware, notes: list[str]) -> list[str]:
    """The listed precisions the hardware supports."""
    precisions = [p for p in listed if p in hardware.precisions]
    dropped = [p for p in listed if p not in hardware.precisions]
    if dropped:
        notes.append(
            f"{', '.join(dropped)} not supported on {hardware.accelerator} "
            f"({hardware.device_name}): dropped from the space"
        )
    if not precisions:
        raise SpaceError(
            f"space allows precision {listed} but this {hardware.accelerator} "
            f"supports only {list(hardware.precisions)}; add one of those to 'precision'"
        )
    return precisions


def keep_offload_targets(
    offload_optimizer: list[str],
    offload_param: list[str],
    zero_stages: list[int],
    nvme_path: str | None,
    nvme_unavailable: str | None,
    notes: list[str],
) -> tuple[list[str], list[str]]:
    """The offload targets usable here: nvme needs a path and the async I/O op, and NVMe
    optimizer offload needs ZeRO-3 among the stages."""
    offload_optimizer, offload_param = list(offload_optimizer), list(offload_param)
    if "nvme" in offload_optimizer and 3 not in zero_stages:
        if offload_optimizer == ["nvme"]:
            raise SpaceError(
                f"space lists offload_optimizer [nvme] with zero_stage {zero_stages}, "
                "but DeepSpeed offloads optimizer states to NVMe only at ZeRO-3 (at 1-2 "
                "it offloads to CPU); add 3 to zero_stage or list cpu instead"
            )
        notes.append("offload_optimizer nvme dropped: it needs zero_stage 3, not listed")
        offload_optimizer.remove("nvme")
    if "nvme" in offload_optimizer or "nvme" in offload_param:
        reason = nvme_unavailable
        if not nvme_path:
            reason = "it needs --nvme-path DIR, a folder on an NVMe disk"
        if reason:
            for key, values in (
                ("offload_optimizer", offload_optimizer),
                ("offload_param", offload_param),
            ):
                if values == ["nvme"]:
                    raise SpaceError(
                        f"space key {key} lists only 'nvme', but {reason}; pass "
                        "--nvme-path DIR (with libaio installed) or list other targets"
                    )
            notes.append(f"nvme offload dropped: {reason}")
            offload_optimizer = [d for d in offload_optimizer if d != "nvme"]
            offload_param = [d for d in offload_param if d != "nvme"]
    return offload_optimizer, offload_param


def keep_micro_batches(
    micro_batch_sizes: list[int],
    accumulation_steps: list[int],
    *,
    data_parallel_size: int,
    global_batch: int | None,
    max_global_batch: int | None,
    notes: list[str],
) -> list[int]:
    """Micro-batches that divide the per-rank batch, or with ``global_batch=None``
    (``--global-batch auto``) that fit under ``max_global_batch`` with some accumulation."""
    if global_batch is not None and global_batch % data_parallel_size:
        raise SpaceError(
            f"--global-batch {global_batch} is not divisible by the {data_parallel_size} "
            f"data-parallel ranks of a trial; pick a multiple of {data_parallel_size}"
        )
    if global_batch is not None:
        per_rank = global_batch // data_parallel_size
        micro_batches = sorted(m for m in micro_batch_sizes if per_rank % m == 0)
        if not micro_batches:
            raise SpaceError(
                f"no micro_batch_size in {micro_batch_sizes} divides the per-rank batch "
                f"{per_rank} (--global-batch {global_batch} / {data_parallel_size} ranks); "
                "add a divisor to micro_batch_size or change --global-batch"
            )
        skipped = sorted(set(micro_batch_sizes) - set(micro_batches))
        if skipped:
            notes.append(
                f"micro_batch_size {skipped} do not divide the per-rank batch {per_rank}: "
                "not candidates"
            )
        return micro_batches
    if max_global_batch is None:
        raise SpaceError(
            "--global-batch auto needs --max-global-batch N, the largest global batch "
            "your training may use"
        )
    smallest_accumulation = min(accumulation_steps)
    micro_batches = sorted(
        m
        for m in micro_batch_sizes
        if m * smallest_accumulation * data_parallel_size <= max_global_batch
    )
    if not micro_batches:
        raise SpaceError(
            f"--max-global-batch {max_global_batch} is below every micro_batch_size in "
            f"{micro_batch_sizes} x {data_parallel_size} ranks; raise it"
        )
    return micro_batches


def keep_stages(
    zero_stages: list[int], offload_optimizer: list[str], offload_param: list[str]
) -> list[int]:
    """The stages at which some listed offload pair is valid, so that define-by-run
    decisions (offload asked only where it can vary) never leave the valid set."""
    kept = [
        stage
        for stage in zero_stages
        if any(
            combination_problem(stage, opt, param) is None
            for opt in offload_optimizer
            for param in offload_param
        )
    ]
    if not kept:
        problems = {
            combination_problem(s, o, p)
            for s in zero_stages
            for o in offload_optimizer
            for p in offload_param
        }
        raise SpaceError(
            f"no zero_stage in {zero_stages} is valid with offload_optimizer "
            f"{offload_optimizer} and offload_param {offload_param}: "
            + "; ".join(sorted(filter(None, problems)))
        )
    return kept


def checkpoint_fractions_of(
    fractions: list[float], blocks: int, notes: list[str]
) -> tuple[float, ...]:
    """Each listed share of ``blocks`` as the whole number of blocks it recomputes (k /
    ``blocks``), in ascending order; shares that round to the same count are one, with a
    note."""
    from autotune.workloads.checkpointing import checkpointed_block_count

    by_count: dict[int, list[float]] = {}
    for fraction in fractions:
        by_count.setdefault(checkpointed_block_count(fraction, blocks), []).append(fraction)
    for count, same in sorted(by_count.items()):
        if len(same) > 1:
            listed = ", ".join(f"{f:g}" for f in same)
            notes.append(
                f"checkpoint_fraction {listed} recompute the same {count} of {blocks} blocks: "
                "one candidate"
            )
    return tuple(count / blocks for count in sorted(by_count))
