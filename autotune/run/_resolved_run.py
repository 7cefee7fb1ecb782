"""A run's settings resolved against the hardware, the workload, the space and the base
config: everything checked before any process starts or any trial is written."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import SettingsError
from autotune.settings import RunSettings
from autotune.study import StudyConfig
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.candidate import Candidate
    from autotune.hardware import Hardware
    from autotune.space import BoundSpace, SpaceSpec
    from autotune.training_goal import TrainingGoal
    from autotune.workloads import Workload


@dataclass
class ResolvedRun:
    """What one ``autotune run`` will do."""

    settings: RunSettings
    hardware: Hardware
    workload: Workload
    workload_ref: str
    space: BoundSpace
    study_name: str
    config: StudyConfig
    trials_dir: Path
    probe_timeout_s: float = 300.0
    notes: list[str] = field(default_factory=list)
    torch_adam: bool = False  # FusedAdam does not build here: probes step with torch's Adam
    largest_param_numel: int = 0  # sizes NVMe parameter offload's swap buffer

    def label_of(self, candidate: Candidate) -> str:
        """The candidate's label, with its world size where the study searches it
        ("z0 fp32 mb4x1 on 2"): what its record, events and every output show."""
        if not self.config.world_sizes:
            return candidate.label
        return f"{candidate.label} on {candidate.data_parallel_size}"

    @property
    def goal(self) -> TrainingGoal:
        """The run's training goal, with the workload's tokens per sample (``--train-tokens``
        in samples)."""
        tokens = max(int(getattr(self.workload, "tokens_per_sample", 1) or 1), 1)
        return self.settings.goal.model_copy(update={"tokens_per_sample": tokens})

    def backend_config(self, candidate: Candidate, nvme_dir: str | None = None) -> dict[str, Any]:
        """The config a probe of ``candidate`` runs with (its own NVMe folder, if any)."""
        from autotune.backends import get_backend

        backend = get_backend(candidate.backend)
        config = backend.render_config(
            candidate,
            self.config.base_config,
            nvme_path=nvme_dir or self.config.nvme_path,
            largest_param_numel=self.largest_param_numel,
        )
        if self.torch_adam:
            config = backend.with_fallback_optimizer(config)
        return config


def bind_space(
    spec: SpaceSpec,
    hardware: Hardware,
    *,
    ranks: int,
    global_batch: int | None,
    max_global_batch: int | None,
    nvme_path: str | None,
    world_sizes: tuple[int, ...] = (),
    script: bool = False,
    workload: Workload | None = None,
) -> BoundSpace:
    """Bind a space, asking the backend what it supports only where the space needs it;
    each backend says whether this study can train with it here (its torch floor; a
    ``script`` study trains with the engine the script builds, DeepSpeed's), and one it
    cannot is dropped with its reason (``BoundSpace.dropped_backends``). A space that lists
    checkpoint fractions counts them in ``workload``'s blocks."""
    from autotune.backends import BACKENDS, get_backend
    from autotune.workloads.checkpointing import partial_checkpointing_blocks

    backends = [get_backend(name) for name in spec.backend]
    nvme_unavailable = None
    if spec.uses("nvme") and nvme_path:  # unavailable when no backend of the space offers it
        problems = [backend.nvme_offload_problem(hardware) for backend in backends]
        nvme_unavailable = problems[0] if all(problems) else None
    unavailable = {
        name: problem
        for name in BACKENDS
        if (problem := get_backend(name).unavailable(script=script)) is not None
    }
    return spec.bind(
        hardware,
        data_parallel_size=ranks,
        global_batch=global_batch,
        max_global_batch=max_global_batch,
        nvme_path=nvme_path,
        nvme_unavailable=nvme_unavailable,
        partial_offload_supported=any(b.partial_offload_supported() for b in backends),
        world_sizes=world_sizes,
        unavailable_backends=unavailable,
        checkpoint_blocks=(
            partial_checkpointing_blocks(workload)
            if spec.checkpoint_fraction is not None and workload is not None
            else None
        ),
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


def resolve_run(settings: RunSettings, hardware: Hardware | None = None) -> ResolvedRun:
    """Check and resolve everything a run needs before any process is started."""
    from autotune.space import load_space
    from autotune.study import check_reachable

    # every setting is checked before anything is written or measured
    check_reachable(settings.storage.storage_url)
    check_writable(settings.storage.trials_dir, flag="--trials-dir")
    space_spec = load_space(settings.space)
    nvme_path = check_nvme_path(settings.limits.nvme_path)
    _check_flags_together(settings)
    hardware = _run_hardware(settings, hardware)
    whole_nodes: list[str] = []
    settings = _whole_node_world_sizes(settings, hardware, whole_nodes)
    per_trial = _gpus_per_trial(settings)
    inputs = _inputs(settings, space_spec, per_trial, hardware)
    vram_limit_bytes = _vram_limit_bytes(settings, hardware)
    bound = bind_space(
        inputs.space,
        hardware,
        ranks=per_trial,
        global_batch=inputs.global_batch,
        max_global_batch=settings.limits.max_global_batch,
        nvme_path=nvme_path,
        world_sizes=settings.limits.searched_world_sizes,
        script=settings.script is not None,
        workload=inputs.workload,
    )
    notes = [*whole_nodes, *inputs.notes, *bound.notes]
    if inputs.base is not None and settings.script is None:
        _check_base(inputs.base, bound, str(settings.base_config), nvme_path)
    if inputs.global_batch is None:
        notes.append(
            "--global-batch auto: the global batch varies up to "
            f"{settings.limits.max_global_batch}; the chosen one may need a rescaled learning "
            "rate (summary.md says)"
        )
    config = _study_config(settings, inputs, hardware, per_trial, vram_limit_bytes, nvme_path)
    study_name = settings.storage.study_name or inputs.study_name
    if settings.script is None:
        _size_workload_probes(inputs, settings, hardware, bound, per_trial)
    return ResolvedRun(
        settings=settings,
        hardware=hardware,
        workload=inputs.workload,
        workload_ref=inputs.ref,
        space=bound,
        study_name=study_name,
        config=config,
        trials_dir=settings.storage.trials_dir.resolve() / study_name,
        probe_timeout_s=inputs.probe_timeout_s,
        notes=notes,
        largest_param_numel=inputs.largest_param_numel,
    )


def _check_flags_together(settings: RunSettings) -> None:
    """Flags that need another flag, or exclude one."""
    if settings.script is not None and settings.goal.train_tokens is not None:
        from autotune.run.forecast import TOKENS_OF_A_SCRIPT

        raise SettingsError(TOKENS_OF_A_SCRIPT)
    if settings.limits.global_batch == "auto" and settings.limits.max_global_batch is None:
        raise SettingsError(
            "--global-batch auto needs --max-global-batch N, the largest global batch "
            "your training may use"
        )
    flag = (
        "--verify strict"
        if settings.search.verify_strict
        else "--verify"
        if settings.search.checks_loss
        else ""
    )
    if flag and settings.probe.ray_address is not None:
        raise SettingsError(
            f"{flag}: the loss check runs on this machine, not on the Ray cluster; leave "
            f"{flag} out and run autotune verify on a node with the devices"
        )


def _run_hardware(settings: RunSettings, hardware: Hardware | None) -> Hardware:
    """The hardware a probe runs on: given, a Ray cluster node's, or this machine's."""
    from autotune.hardware import detect

    if hardware is None and settings.probe.ray_address is not None:
        from autotune.execution import cluster_hardware

        # a node's, not this machine's; a script's ranks need it and the working folder there
        paths = (settings.script.path, os.getcwd()) if settings.script else ()
        hardware = cluster_hardware(settings.probe.ray_address, paths)
    hardware = hardware or detect()
    if settings.probe.ray_address is None:  # a cluster's devices are checked as it is joined
        hardware.check_ranks(settings.limits.gpus)
    return hardware


def _whole_node_world_sizes(
    settings: RunSettings, hardware: Hardware, notes: list[str]
) -> RunSettings:
    """The searched world sizes a Ray cluster can hold as a production run would: within
    one node, or whole nodes beyond one (a probe's ranks pack onto the fewest nodes, so a
    size that leaves a node part-used measures a layout production would not choose). A
    size dropped is a note; ``settings`` with the kept sizes."""
    per_node = hardware.devices_per_node
    if not settings.limits.searched_world_sizes or per_node is None:
        return settings
    kept = tuple(n for n in settings.limits.world_sizes if n <= per_node or n % per_node == 0)
    dropped = [n for n in settings.limits.world_sizes if n not in kept]
    if dropped:
        notes.append(
            f"{', '.join(map(str, dropped))} rank(s) dropped from the world sizes: beyond one "
            f"node ({per_node} device(s)) a world size takes whole nodes"
        )
    if not kept:
        raise SettingsError(
            f"--gpus {','.join(map(str, settings.limits.world_sizes))}: no world size fits the "
            f"cluster's nodes of {per_node} device(s) (within one node, or whole nodes)"
        )
    limits = settings.limits.model_copy(update={"world_sizes": kept})
    return settings.model_copy(update={"limits": limits})


def _gpus_per_trial(settings: RunSettings) -> int:
    per_trial = settings.limits.gpus_per_trial or settings.limits.gpus
    if per_trial > settings.limits.gpus:
        raise SettingsError(
            f"--gpus-per-trial {per_trial} exceeds --gpus {settings.limits.gpus}; a probe "
            "cannot use more devices than the study has"
        )
    return per_trial


def _vram_limit_bytes(settings: RunSettings, hardware: Hardware) -> int:
    vram_limit_bytes = settings.limits.vram_limit_bytes or hardware.default_vram_limit_bytes(
        settings.limits.gpus
    )
    if hardware.accelerator == "cuda" and vram_limit_bytes > hardware.device_memory_bytes:
        raise SettingsError(
            f"--vram {format_bytes(vram_limit_bytes)} exceeds the "
            f"{format_bytes(hardware.device_memory_bytes)} of each GPU; pass --vram auto or less"
        )
    return vram_limit_bytes


def _study_config(
    settings: RunSettings,
    inputs: _Inputs,
    hardware: Hardware,
    per_trial: int,
    vram_limit_bytes: int,
    nvme_path: str | None,
) -> StudyConfig:
    """What the study records of the run: the settings every trial of it shares."""
    return StudyConfig(
        workload=inputs.ref,
        space=inputs.space.stored(),
        accelerator=hardware.accelerator,
        gpus_per_trial=per_trial,
        world_sizes=list(settings.limits.searched_world_sizes),
        global_batch=inputs.global_batch,
        max_global_batch=settings.limits.max_global_batch if inputs.global_batch is None else None,
        vram_limit_bytes=vram_limit_bytes,
        base_config=inputs.base,
        nvme_path=nvme_path,
        threads_per_rank=hardware.threads_per_rank(settings.limits.gpus),
        float32_matmul_precision="high" if settings.probe.tf32 else "highest",
        script=settings.script,
    )


def _size_workload_probes(
    inputs: _Inputs, settings: RunSettings, hardware: Hardware, bound: BoundSpace, per_trial: int
) -> None:
    """Build a workload's model once (its largest parameter) and set its probes' timeout."""
    inputs.largest_param_numel = check_model_builds(inputs.workload, settings.workload)
    inputs.probe_timeout_s = settings.probe.probe_timeout_s or derived_probe_timeout_s(
        inputs.workload,
        hardware,
        inputs.global_batch or settings.limits.max_global_batch or 1,
        min(settings.limits.searched_world_sizes or (per_trial,)),  # the most work per rank
        settings,
        fp16="fp16" in bound.precisions,
    )


@dataclass
class _Inputs:
    """What a workload (or a script) brings to a resolved."""

    workload: Workload
    ref: str
    study_name: str
    base: dict[str, Any] | None
    global_batch: int | None
    space: SpaceSpec
    notes: list[str] = field(default_factory=list)
    probe_timeout_s: float = 0.0
    largest_param_numel: int = 0


def _inputs(settings: RunSettings, space: SpaceSpec, per_trial: int, hardware: Hardware) -> _Inputs:
    """What the script or the workload brings, its space less what it cannot do here."""
    if settings.script is None:
        return _workload_inputs(settings, space, hardware)
    inputs = _script_inputs(settings, space, per_trial)
    inputs.space = _offload_where_it_frees_the_device(
        inputs.space, hardware, inputs.workload, True, inputs.notes
    )
    return inputs


def _workload_inputs(settings: RunSettings, space: SpaceSpec, hardware: Hardware) -> _Inputs:
    from autotune.space import base_global_batch, load_base_config
    from autotune.workloads import absolute_workload_ref, get_workload, workload_study_name

    workload = get_workload(settings.workload)
    base = load_base_config(settings.base_config) if settings.base_config else None
    global_batch = None
    if settings.limits.global_batch != "auto":
        global_batch = base_global_batch(
            base or {}, settings.limits.global_batch, str(settings.base_config)
        )
        global_batch = global_batch or workload.default_global_batch
    notes: list[str] = []
    space = workload_space(space, workload, settings.workload, hardware, notes)
    return _Inputs(
        workload=workload,
        ref=absolute_workload_ref(settings.workload),
        study_name=workload_study_name(settings.workload),
        base=base,
        global_batch=global_batch,
        space=space,
        notes=notes,
    )


def workload_space(
    space: SpaceSpec, workload: Workload, ref: str, hardware: Hardware, notes: list[str]
) -> SpaceSpec:
    """``space`` less what ``workload`` (``ref``) cannot do on ``hardware``, each drop a
    note: what ``autotune run`` searches of it, and ``autotune space`` counts."""
    check_model_builds(workload, ref)  # before the drops build it
    space = _checkpointing_the_workload_does(space, workload, notes)
    return _offload_where_it_frees_the_device(space, hardware, workload, False, notes)


def _checkpointing_the_workload_does(
    space: SpaceSpec, workload: Workload, notes: list[str]
) -> SpaceSpec:
    """``space`` less the checkpointing ``workload`` cannot do, each drop a note: any (it
    does not override ``enable_activation_checkpointing``), a share of its blocks between
    none and all (its override takes no ``blocks``), the selective policy (no
    ``policy``)."""
    from autotune.workloads.checkpointing import partial_checkpointing_blocks, takes

    if "selective" in (space.checkpoint_policy or ()) and not takes(workload, "policy"):
        notes.append(
            f"checkpoint_policy selective dropped: workload {workload.name!r} recomputes its "
            "blocks in full (its enable_activation_checkpointing takes no policy)"
        )
        space = space.model_copy(update={"checkpoint_policy": ["full"]})

    fractions = space.checkpointing_fractions
    if any(fractions) and not _checkpoints(workload):
        notes.append(
            f"workload {workload.name!r} does not override enable_activation_checkpointing: "
            "checkpointing dropped from the space"
        )
        return space.with_checkpointing([0.0])
    partial = [f for f in fractions if 0 < f < 1]
    if partial and partial_checkpointing_blocks(workload) is None:
        notes.append(
            f"checkpoint_fraction {', '.join(f'{f:g}' for f in partial)} dropped: workload "
            f"{workload.name!r} recomputes all of its blocks or none (its "
            "enable_activation_checkpointing takes no blocks)"
        )
        return space.with_checkpointing([f for f in fractions if f in (0, 1)] or [0.0])
    return space


def _offload_where_it_frees_the_device(
    space: SpaceSpec, hardware: Hardware, workload: Workload, script: bool, notes: list[str]
) -> SpaceSpec:
    """``space`` without ``activation_offload: cpu`` where moving the kept blocks' saved
    activations to the host cannot be done or frees nothing, one note: for a script (it
    builds and runs its own model, whose blocks autotune cannot hook), on CPU ranks (host
    and device are one memory: the probe's peak would count every moved byte again), for a
    workload without blocks (nothing to wrap)."""
    from autotune.workloads.checkpointing import block_count

    if "cpu" not in (space.activation_offload or ()):
        return space
    if script:
        why = f"{workload.name} runs its own model (autotune cannot hook its blocks)"
    elif hardware.accelerator == "cpu":
        why = (
            "the ranks are CPU ranks, where host and device are one memory (moving "
            "activations frees nothing); its benefit is measured by benchmarks/gpu_check"
        )
    elif not block_count(workload):
        why = f"workload {workload.name!r} has no blocks (its checkpoint_blocks is empty)"
    else:
        return space
    notes.append(f"activation_offload cpu dropped: {why}")
    return space.model_copy(update={"activation_offload": ["none"]})


def _checkpoints(workload: Workload) -> bool:
    """The workload can turn activation checkpointing on (overrides the base's method)."""
    from autotune.workloads.base import Workload as Base

    method = getattr(type(workload), "enable_activation_checkpointing", None)
    return method is not None and method is not Base.enable_activation_checkpointing


def _script_inputs(settings: RunSettings, space: SpaceSpec, ranks: int) -> _Inputs:
    from autotune.run._script_inputs import script_inputs

    found = script_inputs(settings, space, ranks)
    return _Inputs(
        workload=found.workload,
        ref=settings.workload,
        study_name=found.workload.name.rpartition(".")[0] or found.workload.name,
        base=found.base,
        global_batch=found.global_batch,
        space=found.space,
        notes=found.notes,
        probe_timeout_s=found.probe_timeout_s,
    )


def _check_base(base: dict[str, Any], bound: BoundSpace, source: str, nvme: str | None) -> None:
    from autotune.backends import get_backend
    from autotune.space import check_conflicts, find_auto_values

    check_conflicts(base, bound, source)
    first = next(bound.candidates())
    rendered = get_backend(first.backend).render_config(first, base, nvme_path=nvme)
    autos = find_auto_values(rendered)
    if autos:
        raise SettingsError(
            f'--base-config {source} leaves {", ".join(autos[:3])} as "auto", a '
            "placeholder only the Hugging Face Trainer fills in; give values"
        )


def check_model_builds(workload: Workload, ref: str) -> int:
    """Build the workload's model on the meta device once (the memory and cost models do
    the same), so user code that fails says so in one line before anything starts; return
    the elements of its largest parameter. A model whose counts are kept from an earlier
    run (:func:`autotune.memory.model_facts`) built then and is not built again."""
    from autotune.errors import WorkloadError
    from autotune.memory import model_facts

    try:
        return model_facts(workload, 0).largest_param
    except Exception as exc:  # noqa: BLE001 - user code: any failure is the user's to fix
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise WorkloadError(
            f"workload {ref!r}: build_model() failed on the meta device with "
            f"{type(exc).__name__}: {first}; fix the model code (it must build without data "
            "or downloads)"
        ) from None


def check_writable(folder: Path, *, flag: str) -> None:
    """Fail before anything runs if ``folder`` cannot take the run's files (a read-only
    mount, a full disk, a file in the way), creating nothing
    (:func:`autotune.writable.check_folder_writable`)."""
    from autotune.writable import check_folder_writable, why_not_writable

    try:
        check_folder_writable(folder)
    except OSError as exc:
        raise SettingsError(
            f"{flag} {folder}: cannot write there ({why_not_writable(exc)}); make it "
            f"writable, free space, or pass {flag} OTHER_FOLDER"
        ) from None


# Seconds a probe may spend before its first step: interpreter, imports, process group,
# model build, deepspeed.initialize. Several times what a cold gpt-tiny probe takes on 2 CPU
# cores (benchmarks/RESULTS.md, "Start and end of a run and of a probe launch"): the margin
# covers slow shared filesystems and busy hosts.
PROBE_START_S = 120.0
# A conservative training rate per device (FLOP/s): far below an H100's bf16 peak and an
# AVX2 core's fp32 peak, so a healthy probe is never cut off.
_RATE_FLOP_S = {"cuda": 20e12, "cpu": 2e9}


def derived_probe_timeout_s(
    workload: Workload,
    hardware: Hardware,
    global_batch: int,
    ranks: int,
    settings: RunSettings,
    *,
    fp16: bool = False,
) -> float:
    """The default ``--probe-timeout``: start-up plus every probe step at a pessimistic
    rate (:func:`steps_timeout_s`)."""
    steps = settings.probe.warmup_steps + settings.probe.timed_steps
    if fp16:  # steps the loss scaler skips are run again, in warm-up and in timing
        from autotune.timing import MAX_SKIPPED_STEPS

        steps += 2 * MAX_SKIPPED_STEPS
    threads = hardware.threads_per_rank(ranks) if hardware.accelerator == "cpu" else 1
    return steps_timeout_s(workload, hardware.accelerator, threads, global_batch, ranks, steps)


def steps_timeout_s(
    workload: Workload, accelerator: str, threads: int, global_batch: int, ranks: int, steps: int
) -> float:
    """Start-up plus ``steps`` optimizer steps at a pessimistic rate, times 4 for offload
    and recomputation. Training costs ~6 FLOPs per parameter and token (Kaplan et al. 2020,
    "Scaling Laws for Neural Language Models", sec. 2.1)."""
    from autotune.memory import model_facts

    params = model_facts(workload, 0).params
    flops_per_rank_step = 6 * params * workload.tokens_per_sample * global_batch / ranks
    rate = _RATE_FLOP_S[accelerator]
    if accelerator == "cpu":
        rate *= threads
    build_s = params / 1e8  # random init of the weights, ~1 s per 100M parameters
    return round(PROBE_START_S + build_s + 4 * steps * flops_per_rank_step / rate)
