"""The data that crosses process boundaries: driver -> probe ranks -> driver.

:class:`ProbeSpec` is what a probe is asked to do; every rank writes one
:class:`RankReport`; the executor folds them into one :class:`ProbeResult`. These are
plain data (pydantic, JSON on disk and over Ray): no exception ever crosses them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune.candidate import Candidate
from autotune.measurement import (
    DevicePeaks,
    Fp16Skips,
    HostPeakMeasure,
    HostPeaks,
    LaunchTimes,
    LogTail,
    StepTimes,
    Throughput,
    Versions,
)

ProbeStatus = Literal["ok", "oom", "error", "timeout"]
# "unclean": a warm rank found memory of earlier candidates still allocated at the start of
# this one; it probed nothing, and its worker restarts the group and probes the job cold.
RankStatus = Literal["ok", "oom", "error", "unclean"]
# Faults a probe can be told to inject, for tests of the tuner's failure handling; a CUDA
# OOM cannot be produced on a CPU machine, so "oom" raises torch.OutOfMemoryError itself.
# "leak" keeps the candidate's model and a tensor alive after the probe, standing in for a
# library that holds on to an engine, so the next candidate in the group starts unclean.
Fault = Literal["none", "oom", "error", "crash", "hang", "leak"]
# torch.set_float32_matmul_precision: "highest" is PyTorch's default (no TF32 on CUDA);
# "high" lets fp32 matmuls use TF32 on Ampere and later, "medium" bf16.
Float32MatmulPrecision = Literal["highest", "high", "medium"]
# How a CUDA rank measured its memory outside PyTorch's allocator: NVML's figure for its own
# process ("process"), the whole device's ("device": other processes on the GPU count too),
# or not at all ("none": CPU ranks).
OverheadMethod = Literal["process", "device", "none"]
PERSISTENCE_THRESHOLD = 100_000  # ZeRO-3's default stage3_param_persistence_threshold
HOST_PEAK_WORDS: dict[str, str] = {
    "kernel_hwm": "peak resident memory (kernel high-water mark)",
    "sampled": "peak resident memory (sampled)",
    "at_end": "resident memory at the probe's end",
}
# The node a rank runs on, set by a launcher whose ranks span nodes (a Ray placement group);
# a rank without it runs on its launcher's host and names it by its host name.
NODE_ENV = "AUTOTUNE_NODE"


# A script probe's rank 0 writes the config the script passed to deepspeed.initialize (as a
# dict, before the candidate's keys are laid over it) into the trial folder under this name.
SCRIPT_CONFIG_FILE = "script_ds_config.json"
# Each rank of a script probe leaves this file in the trial folder when the script reaches
# deepspeed.initialize: the driver tells a script that hung before it from one that hung after.
INITIALIZED_MARKER = "initialized-rank-{rank}"


class ScriptRun(BaseModel):
    """A user's own training script as the probe (``python -m autotune.probe.script_rank``): it
    runs unedited with these arguments, and the config it hands to ``deepspeed.initialize``
    is the base the candidate's tuned keys are laid over."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="The script, an absolute path.")
    argv: list[str] = Field(
        description="Its arguments for this candidate: the config path and the mapped batch, "
        "accumulation, checkpointing and precision flags rewritten."
    )
    nvme_path: str | None = Field(
        default=None, description="NVMe folder of this probe, for nvme offload candidates."
    )
    torch_adam: bool = Field(
        default=False, description="Step with torch's Adam (FusedAdam does not build here)."
    )


class ModelInfo(BaseModel):
    """The model a script handed to ``deepspeed.initialize``: what the ZeRO model-state
    formulas need (parameter counts as DeepSpeed's estimators count them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    params: int = Field(description="Unique parameters (tied weights once).")
    trainable_params: int = Field(description="Parameters that require gradients.")
    largest_param: int = Field(description="Elements of the largest parameter tensor.")
    small_params: int = Field(
        description="Elements in tensors under ZeRO-3's default persistence threshold (1e5)."
    )
    dtype: str = Field(description="Dtype of the floating-point parameters as handed over.")
    module: str = Field(default="", description="Class name of the model.")

    @classmethod
    def of(cls, model: Any) -> ModelInfo:
        """``model``'s counts as DeepSpeed's estimators count them: shared tensors once, a
        ZeRO-3 partitioned parameter by its full size (``ds_numel``)."""
        unique = {id(p): p for p in model.parameters()}.values()
        sizes = [(int(getattr(p, "ds_numel", p.numel())), p) for p in unique]
        floating = next((p for _, p in sizes if p.is_floating_point()), None)
        return cls(
            params=sum(n for n, _ in sizes),
            trainable_params=sum(n for n, p in sizes if p.requires_grad),
            largest_param=max((n for n, _ in sizes), default=0),
            small_params=sum(n for n, _ in sizes if n < PERSISTENCE_THRESHOLD),
            dtype=str(floating.dtype).removeprefix("torch.") if floating is not None else "",
            module=type(model).__name__,
        )


class LossRun(BaseModel):
    """A loss run instead of a timed probe (``autotune verify``): train the
    candidate's engine from a fixed seed for a fixed number of optimizer steps and record
    each step's loss, as :class:`LossTrace`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(gt=0, description="Optimizer steps to train and record.")
    seed: int = Field(
        default=0,
        description="Seed of python's random, numpy and torch, and of the fp32 weights every "
        "run of a loss check starts from.",
    )
    inject_nan_at_step: int | None = Field(
        default=None,
        description="Tests only: multiply this step's loss by NaN on every rank (a stand-in "
        "for an overflow), to check that the comparison finds it.",
    )


class LossTrace(BaseModel):
    """What a loss run recorded: each optimizer step's loss, gradient norm and
    skip, and the weights it started from. NaN and inf are kept as computed (JSON
    ``NaN``/``Infinity``)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    losses: list[float] = Field(
        description="Each optimizer step's loss: the mean over the global batch, i.e. over "
        "every micro-batch of every rank, the average whose gradient DeepSpeed steps with "
        "(backward divides by the accumulation steps, the all-reduce by the ranks)."
    )
    grad_norms: list[float | None] = Field(
        description="Each step's gradient norm before clipping: engine.get_global_grad_norm() "
        "where DeepSpeed reports it (its ZeRO and 16-bit optimizers), else the module's "
        "gradients as the step found them (fp32 at ZeRO-0); None where neither has one."
    )
    skipped: list[bool] = Field(
        description="Each step: the fp16 loss scaler skipped it (overflow) on some rank."
    )
    initial_weights_sha256: str = Field(
        description="SHA-256 of the fp32 weights the run started from (name order): the "
        "seeded build of a built-in workload, or the model a script handed to "
        "deepspeed.initialize; two runs with the same digest started from the same weights."
    )
    initial_weights_sq_sum: float = Field(
        description="Sum of squares of those fp32 weights, in float64."
    )
    loaded_weights_sq_sum: float = Field(
        description="The same sum over the weights as the candidate's model held them before "
        "deepspeed.initialize (gathered at ZeRO-3): it differs from the source's only by the "
        "rounding to the candidate's dtype, which the rank checks."
    )
    batch_statistics: bool = Field(
        default=False,
        description="The model has modules that normalise over the batch (BatchNorm): their "
        "statistics depend on the micro-batch.",
    )
    gradient_clipping: float = Field(
        default=0.0, description="The engine's gradient clipping threshold (0: none)."
    )
    dropout_modules: int = Field(
        default=0,
        description="Dropout modules switched off for the run (their masks are drawn per "
        "micro-batch: noise of the same distribution, not a different training).",
    )
    sample_digests: list[str] | None = Field(
        default=None,
        description="A script's run: each optimizer step's SHA-256 over the sorted hashes of "
        "the samples every rank's micro-batches held (their integer inputs: token ids, "
        "labels), so two runs are seen to train on the same samples whatever their split; "
        "None where the inputs hold no integer tensor, or for a built-in workload (whose "
        "samples the run makes itself).",
    )


class ScriptFacts(BaseModel):
    """Script probes: what the user's script built, which the memory model learns from."""

    model: ModelInfo | None = Field(
        default=None, description="Script probes: the model handed to deepspeed.initialize."
    )
    activation_bytes: int = Field(
        default=0,
        description="Script probes: tensor bytes one micro-batch's forward left alive, the "
        "largest over warm-up micro-steps (CPU: the tensor tracker's live bytes; CUDA: "
        "torch.cuda.memory_allocated), before and after the engine module's forward.",
    )


class LossRecord(BaseModel):
    """A loss run's record (``autotune verify``)."""

    loss_trace: LossTrace | None = Field(
        default=None, description="A loss run: the losses it recorded (every rank's)."
    )


class ProbeSpec(BaseModel):
    """One probe: which workload (or script), which DeepSpeed config, how long, under which
    limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: str = Field(description="Workload reference, as given to --workload.")
    candidate: Candidate = Field(description="The candidate being probed.")
    backend_config: dict[str, Any] = Field(
        description="The backend's whole config to initialise with (DeepSpeed's JSON, FSDP2's "
        "settings)."
    )
    accelerator: Literal["cuda", "cpu"] = Field(description="Device kind of the ranks.")
    vram_limit_bytes: int = Field(description="Peak memory a rank may reach.")
    device_memory_bytes: int = Field(description="Physical memory of one device.")
    warmup_steps: int = Field(default=2, description="Untimed optimizer steps, at least.")
    max_warmup_steps: int | None = Field(
        default=None, description="Warm up until step time settles, at most this (None: fixed)."
    )
    timed_steps: int = Field(default=5, description="Timed optimizer steps, at least.")
    max_timed_steps: int | None = Field(
        default=None,
        description="Time until the 95% interval is within target_spread, at most this many "
        "steps (None: exactly timed_steps).",
    )
    target_spread: float = Field(
        default=0.02, description="Relative half-width of the step time's 95% interval."
    )
    max_timed_s: float = Field(default=60.0, description="Cap on time spent in timed steps.")
    stop_below_samples_per_s: float = Field(
        default=0.0,
        description="Stop early once clearly slower than this (the best so far, less a "
        "margin); 0: never.",
    )
    tokens_per_sample: int = Field(default=1, description="For tokens/s.")
    float32_matmul_precision: Float32MatmulPrecision = Field(
        default="highest",
        description="torch.set_float32_matmul_precision for the probe, as production sets it "
        "(highest: PyTorch's default, no TF32; high: TF32 matmuls on CUDA).",
    )
    fault: Fault = Field(default="none", description="Injected fault, for tests only.")
    script: ScriptRun | None = Field(
        default=None, description="The user's script is the probe (workload names it)."
    )
    loss_run: LossRun | None = Field(
        default=None,
        description="A loss run (autotune verify) instead of warm-up and timed steps.",
    )


class BuildInfo(BaseModel):
    """How a rank built the model, checked right after the build."""

    model_config = ConfigDict(extra="forbid")

    zero_init: bool = Field(description="Built under deepspeed.zero.Init (ZeRO-3).")
    device: str = Field(description="Device the parameters were built on.")
    dtype: str = Field(description="Dtype of the floating-point parameters as built.")
    partitioned: bool = Field(description="Every parameter is a ZeRO-3 partition (ds_numel).")
    param_bytes: int = Field(description="Bytes of parameter data this rank holds after build.")
    model_param_count: int = Field(description="Parameters of the whole model.")


class ShardingState(BaseModel):
    """How FSDP2 sharded the model, read from its modules after ``fully_shard``."""

    model_config = ConfigDict(extra="forbid")

    units: int = Field(description="Modules fully_shard was applied to, the root included.")
    resharded_units: int = Field(description="Units that free their parameters after forward.")
    post_forward_ranks: int = Field(description="Ranks a resharded unit keeps its shard over.")
    param_dtype: str = Field(description="MixedPrecisionPolicy.param_dtype of the root.")
    reduce_dtype: str = Field(description="MixedPrecisionPolicy.reduce_dtype of the root.")
    offload: str = Field(description="The root's offload policy class (CPUOffloadPolicy ...).")
    shard_device: str = Field(description="Where this rank's parameter shards live.")
    checkpointed: bool = Field(description="The model recomputes its blocks in backward.")
    first_micro_batch_reduced: bool | None = Field(
        default=None,
        description="Whether a step's first micro-batch left gradient shards (reduced at "
        "once) rather than unsharded gradients; None without gradient accumulation.",
    )


class RankReport(
    StepTimes, HostPeakMeasure, LaunchTimes, Fp16Skips, ScriptFacts, LossRecord, Versions
):
    """What one rank measured; written to ``rank-<r>.json`` before the rank exits."""

    model_config = ConfigDict(extra="forbid")

    rank: int
    status: RankStatus
    error: str = ""
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    host_peak_bytes: int = Field(
        default=0, description="Peak resident memory of this rank's process during the probe."
    )
    node: str = Field(
        default="",
        description="The node the rank ran on: the launcher's node name (NODE_ENV) when the "
        "ranks span nodes, else the host name. Ranks of one node share its host RAM.",
    )
    warmup_s: float = 0.0
    threads: int = 0
    pid: int = Field(default=0, description="The rank's process id (a warm worker keeps it).")
    warmup_step_times_s: list[float] = Field(default_factory=list)
    leaked_bytes: int = Field(
        default=0,
        description="Device (CUDA) or live-tensor (CPU) bytes allocated at the candidate's "
        "start beyond the process's first candidate's: what earlier candidates left behind.",
    )
    pinned_host_bytes_at_start: int = Field(
        default=0,
        description="Pinned host memory PyTorch's host allocator held at the candidate's start "
        "(CUDA): what earlier candidates left in its cache.",
    )
    device_overhead_bytes: int = Field(
        default=0,
        description="CUDA memory outside PyTorch's allocator (context, NCCL, cuBLAS): the "
        "largest reading of the candidate (at its start, after the engine's first optimizer "
        "step, at its end), included in peak_reserved_bytes.",
    )
    overhead_method: OverheadMethod = Field(
        default="none",
        description="How device_overhead_bytes was read: NVML's used memory of this rank's "
        "process less memory_reserved (process), the device's total - free - reserved, which "
        "counts other processes on the GPU too (device: NVML not installed or not listing the "
        "process), or not at all (none: CPU ranks).",
    )
    overhead_at_start_bytes: int = Field(
        default=0,
        description="CUDA memory outside the allocator at the candidate's start (after the "
        "first matmul and collective): the context, cuBLAS, the world group's communicator, "
        "and in a warm rank what earlier candidates left there.",
    )
    overhead_left_bytes: int = Field(
        default=0,
        description="Warm ranks: of overhead_at_start_bytes, the bytes beyond the largest the "
        "process's first candidate measured outside the allocator (left by earlier "
        "candidates), the largest over the ranks; above the leak tolerance the rank is "
        "unclean.",
    )
    build: BuildInfo | None = Field(default=None, description="How the model was built.")
    sharding: ShardingState | None = Field(
        default=None, description="FSDP2 probes: how fully_shard sharded the model."
    )
    optimizer: str = Field(
        default="",
        description="Built-in probes: module.Class of the optimizer that stepped, as the engine "
        "built it (torch's AdamW where FusedAdam does not build, DeepSpeedCPUAdam offloaded).",
    )
    loss_scale_at_start: float = Field(
        default=0.0,
        description="Built-in probes, fp16: the loss scale the engine's scaler held before the "
        "first step; 0 without fp16.",
    )
    loss_scale_at_end: float = Field(
        default=0.0,
        description="Built-in probes, fp16: the loss scale the engine's scaler held after the "
        "timed steps (lower than at the start once a dynamic scaler met overflows); 0 without "
        "fp16.",
    )
    offloaded_pinned_bytes: int = Field(
        default=0,
        description="Built-in probes: bytes of the host (CPU) tensors the optimizer steps (its "
        "parameters, their gradients, its states) that are page-locked (Tensor.is_pinned()) "
        "after the timed steps; on CUDA 0 without optimizer offload (on CPU ranks every "
        "tensor is a host tensor).",
    )
    offloaded_pageable_bytes: int = Field(
        default=0,
        description="Built-in probes: bytes of those host tensors that are not page-locked.",
    )
    pinned_host_bytes_at_end: int = Field(
        default=0,
        description="Built-in probes: pinned host memory PyTorch's host allocator held after "
        "the timed steps, the engine still alive (CUDA; 0 elsewhere): an offloading engine's "
        "page-locked buffers.",
    )


class ProbeResult(
    Throughput,
    DevicePeaks,
    HostPeaks,
    LaunchTimes,
    Fp16Skips,
    ScriptFacts,
    LossRecord,
    Versions,
    LogTail,
):
    """The outcome of one probe, as the tuner records it."""

    model_config = ConfigDict(extra="forbid")

    status: ProbeStatus
    error: str = Field(default="", description="First line of the failure, if any.")
    cold_start: bool = Field(
        default=True,
        description="Its wall time includes starting the process group (interpreter, imports, "
        "process group): a cold launch, or the first probe of a warm worker.",
    )
    timed_s: float = Field(default=0.0, description="Time inside the timed steps.")
    threads_per_rank: int = Field(default=0, description="Intra-op threads torch used per rank.")
    exit_code: int | None = Field(default=None, description="The ranks' launcher's exit code.")
    overhead_bytes_per_rank: list[int] = Field(
        default_factory=list,
        description="CUDA context, NCCL and cuBLAS memory outside the allocator, per rank; "
        "already included in reserved_bytes_per_rank.",
    )
    leak_restart_bytes: int = Field(
        default=0,
        description="The warm group was restarted before this probe because this many bytes "
        "of earlier candidates were still held (allocated, or outside the allocator); the "
        "probe then ran cold.",
    )
    warm_fallback: str = Field(
        default="",
        description="Script probes: why this and the study's later probes of the script run "
        "cold (its warm run failed where a cold launch measured); empty otherwise.",
    )
    lost_node: str = Field(
        default="",
        description="The address of a node that left the Ray cluster while it ran one of this "
        "probe's ranks (status error): nothing was measured about the candidate, which may be "
        "probed again on other nodes. Empty otherwise.",
    )

    @property
    def peak_bytes(self) -> int:
        """What the device had to provide: the worst rank's allocated or reserved peak."""
        return max([*self.peak_bytes_per_rank, *self.reserved_bytes_per_rank, 0])
