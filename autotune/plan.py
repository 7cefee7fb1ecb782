"""A run's settings resolved against the hardware, the workload, the space and the base
config: everything checked before any process starts or any trial is written."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import SettingsError
from autotune.settings import RunSettings, format_bytes
from autotune.study import StudyConfig

if TYPE_CHECKING:
    from autotune.candidate import Candidate
    from autotune.hardware import Hardware
    from autotune.space import BoundSpace, SpaceSpec
    from autotune.workloads import Workload


@dataclass
class Plan:
    """What one ``autotune run`` will do."""

    settings: RunSettings
    hardware: Hardware
    workload: Workload
    workload_ref: str
    space: BoundSpace
    study_name: str
    config: StudyConfig
    trials_dir: Path
    notes: list[str] = field(default_factory=list)

    def ds_config(self, candidate: Candidate, nvme_dir: str | None = None) -> dict[str, Any]:
        """The config a probe of ``candidate`` runs with (its own NVMe folder, if any)."""
        return candidate.to_ds_config(
            self.config.base_config, nvme_path=nvme_dir or self.config.nvme_path
        )


def bind_space(
    spec: SpaceSpec,
    hardware: Hardware,
    *,
    ranks: int,
    global_batch: int | None,
    max_global_batch: int | None,
    nvme_path: str | None,
) -> BoundSpace:
    """Bind a space, asking DeepSpeed what it supports only where the space needs it."""
    from autotune.hardware import async_io_problem, partial_offload_supported

    nvme_unavailable = async_io_problem(hardware) if spec.uses("nvme") and nvme_path else None
    return spec.bind(
        hardware,
        data_parallel_size=ranks,
        global_batch=global_batch,
        max_global_batch=max_global_batch,
        nvme_path=nvme_path,
        nvme_unavailable=nvme_unavailable,
        partial_offload_supported=partial_offload_supported(),
    )


def check_nvme_path(path: Path | None) -> str | None:
    if path is None:
        return None
    if not path.is_dir() or not os.access(path, os.W_OK):
        raise SettingsError(
            f"--nvme-path {path}: not a writable folder; create it on an NVMe disk or pass "
            "another folder"
        )
    return str(path.resolve())


def plan_run(settings: RunSettings, hardware: Hardware | None = None) -> Plan:
    """Check and resolve everything a run needs before any process is started."""
    from autotune.base_config import (
        base_global_batch,
        check_conflicts,
        find_auto_values,
        load_base_config,
    )
    from autotune.hardware import detect
    from autotune.space import load_space
    from autotune.workloads import get_workload, workload_study_name

    space_spec = load_space(settings.space)
    workload = get_workload(settings.workload)
    base = load_base_config(settings.base_config) if settings.base_config else None
    source = str(settings.base_config)
    nvme_path = check_nvme_path(settings.nvme_path)
    if settings.global_batch == "auto":
        global_batch = None
        if settings.max_global_batch is None:
            raise SettingsError(
                "--global-batch auto needs --max-global-batch N, the largest global batch "
                "your training may use"
            )
    else:
        global_batch = base_global_batch(base or {}, settings.global_batch, source)
        global_batch = global_batch or workload.default_global_batch
    hardware = hardware or detect()
    hardware.check_ranks(settings.gpus)
    per_trial = settings.gpus_per_trial or settings.gpus
    if per_trial > settings.gpus:
        raise SettingsError(
            f"--gpus-per-trial {per_trial} exceeds --gpus {settings.gpus}; a probe cannot use "
            "more devices than the study has"
        )
    vram_limit_bytes = settings.vram_limit_bytes or hardware.default_vram_limit_bytes(settings.gpus)
    if hardware.accelerator == "cuda" and vram_limit_bytes > hardware.device_memory_bytes:
        raise SettingsError(
            f"--vram {format_bytes(vram_limit_bytes)} exceeds the "
            f"{format_bytes(hardware.device_memory_bytes)} of each GPU; pass --vram auto or less"
        )
    bound = bind_space(
        space_spec,
        hardware,
        ranks=per_trial,
        global_batch=global_batch,
        max_global_batch=settings.max_global_batch,
        nvme_path=nvme_path,
    )
    notes = list(bound.notes)
    if base is not None:
        check_conflicts(base, bound, source)
        autos = find_auto_values(next(bound.candidates()).to_ds_config(base, nvme_path=nvme_path))
        if autos:
            raise SettingsError(
                f'--base-config {source} leaves {", ".join(autos[:3])} as "auto", a '
                "placeholder only the Hugging Face Trainer fills in; give values"
            )
    if global_batch is None:
        notes.append(
            f"--global-batch auto: the global batch varies up to {settings.max_global_batch}; "
            "the chosen one may need a rescaled learning rate (summary.md says)"
        )
    workload_ref = _absolute_workload_ref(settings.workload)
    config = StudyConfig(
        workload=workload_ref,
        space=space_spec.model_dump(mode="json"),
        accelerator=hardware.accelerator,
        gpus_per_trial=per_trial,
        global_batch=global_batch,
        max_global_batch=settings.max_global_batch if global_batch is None else None,
        vram_limit_bytes=vram_limit_bytes,
        base_config=base,
        nvme_path=nvme_path,
        threads_per_rank=hardware.threads_per_rank(settings.gpus),
    )
    study_name = settings.study_name or workload_study_name(settings.workload)
    return Plan(
        settings=settings,
        hardware=hardware,
        workload=workload,
        workload_ref=workload_ref,
        space=bound,
        study_name=study_name,
        config=config,
        trials_dir=settings.trials_dir.resolve() / study_name,
        notes=notes,
    )


def _absolute_workload_ref(ref: str) -> str:
    """A user file path made absolute, so probes launched elsewhere find it."""
    location, sep, attr = ref.rpartition(":")
    if sep and (location.endswith(".py") or "/" in location):
        return f"{Path(location).resolve()}:{attr}"
    return ref
