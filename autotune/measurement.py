"""What a probe measures, declared once in parts that the records along its way share.

A rank's report (:class:`~autotune.protocol.RankReport`), the probe's result folded from the
ranks' (:class:`~autotune.protocol.ProbeResult`) and the stored trial
(:class:`~autotune.study.TrialRecord`) are each made of the parts they carry, so a
measurement is declared here once, with its unit and meaning, and copied between records
by part (:func:`copy_parts`), never field by field; the parts about a script's model and a
loss run sit in :mod:`autotune.protocol` beside the records they hold. The stored
trial keeps the parts' fields flat, one Optuna user attribute each
(:mod:`autotune.study.records` writes and reads them).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

# How a rank's host memory peak was measured: "kernel_hwm", the kernel's high-water mark of
# the process's resident memory (Linux VmHWM), reset at the probe's start; "sampled", the
# resident memory read every few milliseconds during the probe (where the reset is not
# permitted, or not Linux); "at_end", the resident memory at the probe's end (what records
# written before the peak was measured hold).
HostPeakMethod = Literal["kernel_hwm", "sampled", "at_end"]


class StepTimes(BaseModel):
    """The timed optimizer steps (a rank's own, or the slowest rank's of each step)."""

    step_times_s: list[float] = Field(default_factory=list, description="Each timed step.")
    stopped_early: bool = Field(
        default=False, description="Stopped after a few steps as clearly slower than the best."
    )


class Throughput(StepTimes):
    """The probe's speed over its timed steps, all ranks together."""

    samples_per_s: float = Field(default=0.0, description="Global, median over timed steps.")
    samples_per_s_min: float = Field(default=0.0, description="Slowest timed step.")
    samples_per_s_max: float = Field(default=0.0, description="Fastest timed step.")
    tokens_per_s: float = Field(default=0.0, description="Global, median over timed steps.")
    step_time_s: float = Field(default=0.0, description="Median optimizer-step time.")
    warmup_steps: int = Field(default=0, description="Untimed steps it took to settle.")

    @property
    def spread(self) -> float:
        """Relative spread of throughput over timed steps: (max - min) / median."""
        if self.samples_per_s <= 0:
            return 0.0
        return (self.samples_per_s_max - self.samples_per_s_min) / self.samples_per_s


class DevicePeaks(BaseModel):
    """Device memory each rank reached."""

    peak_bytes_per_rank: list[int] = Field(
        default_factory=list,
        description="Peak allocated (CUDA) or tracked (CPU) tensor bytes, per rank.",
    )
    reserved_bytes_per_rank: list[int] = Field(
        default_factory=list, description="Peak reserved by the CUDA caching allocator."
    )


class HostPeakMeasure(BaseModel):
    """How host memory was measured."""

    host_peak_method: HostPeakMethod = Field(
        default="at_end",
        description="How the host memory peak was measured (see HostPeakMethod); over ranks, "
        "the least exact of theirs (sampled over kernel_hwm).",
    )


class HostPeaks(HostPeakMeasure):
    """Host memory each rank process reached, and the node it ran on."""

    host_peak_bytes_per_rank: list[int] = Field(
        default_factory=list, description="Peak resident host memory of each rank process."
    )
    node_per_rank: list[str] = Field(
        default_factory=list, description="The node each rank ran on (see RankReport.node)."
    )

    def host_peak_per_node(self) -> dict[str, int]:
        """Each node's ranks' host peaks summed: what the node's RAM had to hold."""
        return host_peak_per_node(self.host_peak_bytes_per_rank, self.node_per_rank)


class Versions(BaseModel):
    """What measured it."""

    versions: dict[str, str] = Field(
        default_factory=dict, description="Library versions and numeric settings (TF32)."
    )


class LogTail(BaseModel):
    """What a failed probe said last."""

    log_tail: str = Field(default="", description="Last lines of the probe's log.")


class LaunchTimes(BaseModel):
    """Where a probe's wall time went before and around its steps."""

    init_s: float = Field(default=0.0, description="Imports to the end of the engine's set-up.")
    wall_s: float = Field(default=0.0, description="Launch to exit.")


class Fp16Skips(BaseModel):
    """What the fp16 loss scaler did."""

    skipped_steps: int = Field(
        default=0,
        description="Optimizer steps the fp16 loss scaler skipped (overflow); never timed.",
    )


def copy_parts(source: BaseModel, *parts: type[BaseModel]) -> dict[str, Any]:
    """The fields of ``parts`` as ``source`` holds them: what one record hands the next."""
    return {name: getattr(source, name) for part in parts for name in part.model_fields}


def host_peak_per_node(peaks_bytes: list[int], nodes: list[str]) -> dict[str, int]:
    """The ranks' host peaks summed per node (``nodes[i]`` is rank i's; a rank without a
    node is counted on ""), in the order the nodes first appear. Each rank's peak counts the
    pages it shares with the node's other ranks (libraries, what a forked rank shares with
    its launcher), and the ranks may peak at different moments: the sum bounds from above
    what the node held at once."""
    totals: dict[str, int] = {}
    for index, peak in enumerate(peaks_bytes):
        node = nodes[index] if index < len(nodes) else ""
        totals[node] = totals.get(node, 0) + peak
    return totals
