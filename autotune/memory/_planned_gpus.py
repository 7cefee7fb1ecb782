"""Every valid candidate's predicted memory on GPUs a user plans to use (``autotune plan
--gpus N --vram SIZE``): the memory model on hypothetical devices, nothing probed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.protocol import PERSISTENCE_THRESHOLD

if TYPE_CHECKING:
    from autotune.candidate import Candidate
    from autotune.hardware import Hardware
    from autotune.memory.memory_model import MemoryModel
    from autotune.space import BoundSpace


@dataclass
class PlannedRow:
    """One candidate of ``autotune plan``: predicted memory per rank and whether it fits."""

    fits: bool
    device_bytes: int | None  # None: not traced (a smaller micro-batch already did not fit)
    host_bytes: int | None
    candidate: Candidate
    phase: str  # where the predicted peak is (or "> mbN" when not traced)
    why: str  # "", "device" or "host"


@dataclass
class Planned:
    """What ``autotune plan`` found: every valid candidate, fitting ones first."""

    description: str
    params: int
    active_params: int
    largest_layer_params: int
    gpus: int
    vram_bytes: int
    limit_bytes: float
    margin: float
    host_ram_bytes: int
    global_batch: int
    rows: list[PlannedRow]
    notes: list[str]
    seconds: float


def plan_candidates(
    workload_ref: str,
    *,
    gpus: int,
    vram_bytes: int,
    global_batch: int | None,
    host_ram_bytes: int | None,
    space_ref: str,
    margin: float,
) -> Planned:
    """Every valid candidate on ``gpus`` hypothetical GPUs of ``vram_bytes``, with predicted
    device and host memory per rank, fitting ones first."""
    import time

    import psutil

    from autotune.memory.memory_model import MemoryModel, largest_layer_params, model_facts
    from autotune.space import load_space
    from autotune.workloads import get_workload
    from autotune.workloads.checkpointing import partial_checkpointing_blocks

    started = time.monotonic()
    workload = get_workload(workload_ref)
    spec = load_space(space_ref)
    host_ram = host_ram_bytes or int(psutil.virtual_memory().total)
    target = _planned_hardware(gpus, vram_bytes, host_ram)
    batch = global_batch or workload.default_global_batch
    blocks = partial_checkpointing_blocks(workload) if spec.checkpoint_fraction else None
    bound = spec.bind(target, data_parallel_size=gpus, global_batch=batch, checkpoint_blocks=blocks)
    threshold = vram_bytes * (1.0 - margin)
    model = MemoryModel(workload, accelerator=target.accelerator)
    rows = _planned_rows(bound, model, threshold, gpus, host_ram)
    facts = model_facts(workload, PERSISTENCE_THRESHOLD)
    return Planned(
        description=workload.describe(),
        params=facts.params,
        active_params=facts.active_params or facts.params,
        largest_layer_params=largest_layer_params(workload),
        gpus=gpus,
        vram_bytes=vram_bytes,
        limit_bytes=threshold,
        margin=margin,
        host_ram_bytes=host_ram,
        global_batch=batch,
        rows=rows,
        notes=[note for note in bound.notes if "nvme" in note],
        seconds=time.monotonic() - started,
    )


def _planned_hardware(gpus: int, vram_bytes: int, host_ram_bytes: int) -> Hardware:
    """``gpus`` hypothetical CUDA devices of ``vram_bytes`` on a host of ``host_ram_bytes``."""
    import os

    from autotune.hardware import Hardware

    return Hardware(
        accelerator="cuda",
        device_count=gpus,
        device_name="planned GPU",
        device_memory_bytes=vram_bytes,
        host_memory_bytes=host_ram_bytes,
        cpu_count=os.cpu_count() or 1,
        precisions=("fp32", "bf16", "fp16"),
    )


def _planned_rows(
    bound: BoundSpace, model: MemoryModel, threshold: float, gpus: int, host_ram_bytes: int
) -> list[PlannedRow]:
    """Each candidate's predicted memory and whether it fits, fitting ones first, then by
    device memory."""
    rows = []
    # Activations grow with the micro-batch: once a micro-batch does not fit on the device,
    # larger ones of the same configuration are not traced.
    too_big: dict[str, int] = {}
    for candidate in sorted(bound.candidates(), key=lambda c: c.micro_batch_size):
        shape = candidate.model_copy(
            update={"micro_batch_size": 1, "gradient_accumulation_steps": 1}
        ).key
        if shape in too_big and candidate.micro_batch_size > too_big[shape]:
            rows.append(PlannedRow(False, None, None, candidate, f"> mb{too_big[shape]}", "device"))
            continue
        estimate = model.predict(candidate, stop_above=threshold)
        device, host = estimate.device_bytes, estimate.host_bytes
        why = "device" if device > threshold else ("host" if host * gpus > host_ram_bytes else "")
        if why == "device":
            too_big.setdefault(shape, candidate.micro_batch_size)
        rows.append(PlannedRow(not why, device, host, candidate, estimate.phase, why))
    rows.sort(
        key=lambda r: (not r.fits, r.device_bytes if r.device_bytes is not None else float("inf"))
    )
    return rows
