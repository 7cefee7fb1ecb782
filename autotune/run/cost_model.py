"""Cost model: an analytic estimate of a candidate's optimizer-step time, calibrated by the
probes of the study.

The step time is a sum of terms, each a volume divided by a nominal rate of the hardware,
times a weight that calibration fits (prior 1):

- compute, per precision: ~6 FLOPs per parameter and token for forward + backward (Kaplan
  et al. 2020, "Scaling Laws for Neural Language Models", sec. 2.1), counting the parameters
  a token computes with (a mixture of experts' top-k experts; a DiT's tokens are its latent
  patches, and its per-sample conditioning is left out), 8 with activation
  checkpointing (one more forward, Chen et al. 2016, "Training Deep Nets with Sublinear
  Memory Cost");
- a fixed cost per micro-step (kernel launches, Python, DeepSpeed's hooks), which dominates
  small models and makes micro-batch 1 with 16 accumulation steps slow;
- communication of ZeRO (Rajbhandari et al. 2020, "ZeRO", sec. 7): stages 0-1 all-reduce
  the gradients once per step (2 (d-1)/d Ψ elements), stage 1-2 all-gather the updated
  parameters once per step (on gloo, a large all-gather at its own lower rate), stage 2
  reduce-scatters every micro-step, stage 3 all-gathers parameters twice and
  reduce-scatters gradients every micro-step (3 (d-1)/d Ψ);
- the optimizer step: on the device, proportional to the parameters this rank updates;
  with CPU offload, DeepSpeed's CPU Adam over them plus gradients to and parameters from
  the host (ZeRO-Offload, Ren et al. 2021); NVMe adds the swap volume at disk speed;
- parameter offload (ZeRO-Infinity, Rajbhandari et al. 2021): parameters fetched from the
  host for forward and backward, every micro-step;
- activation offload: the kept blocks' saved activations (the bytes the memory model's
  trace moves to the host) copied out in forward and back in backward, every micro-step,
  over the host link, not overlapped with compute: the hooks copy on the compute stream, as
  torchtune's ``OffloadActivations`` without ``use_streams`` does (its docstring: only the
  extra stream is "intended to overlap with the default computation stream").

Calibration solves for the weights by least squares on relative errors with a ridge pull
toward 1, so two probes already move the model and a dozen pin it down.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.candidate import Candidate

if TYPE_CHECKING:
    from autotune.workloads import Workload

# Nominal rates; calibration corrects them, they only need the right order of magnitude.
_FLOPS = {  # per rank per second
    ("cuda", "fp32"): 20e12,  # IEEE fp32 (PyTorch's default matmul precision), A100-class
    ("cuda", "bf16"): 150e12,
    ("cuda", "fp16"): 150e12,
    ("cpu", "fp32"): 4e9,  # per thread
    ("cpu", "bf16"): 0.5e9,  # per thread, AVX2 without native bf16 (emulated: far slower)
    ("cpu", "fp16"): 0.5e9,
}
_TF32_FLOPS = 75e12  # fp32 matmuls on TF32 tensor cores (--tf32), about half of bf16's
_LINK_BYTES_S = {"cuda": 50e9, "cpu": 1e9}  # collective bandwidth per rank (NVLink / gloo)
# gloo's all-gather keeps the all-reduce's pace up to about 16 MB per rank and falls to a
# third of it beyond (benchmarks/RESULTS.md, "gloo's collectives"), where NCCL's ring
# all-gather keeps it. Above that size the parameters' all-gathers on CPU ranks are priced
# below even gloo's rate, which leaves room for the rest of ZeRO-1/2's per-step work.
_LARGE_ALL_GATHER_ABOVE_BYTES = 16 * 2**20  # a rank's share of one all-gather
_LARGE_ALL_GATHER_BYTES_S = {"cpu": 0.25e9}
# A probe spanning nodes: a ring collective runs at its slowest link (Patarasuk and Yuan,
# "Bandwidth optimal all-reduce algorithms for clusters of workstations", 2009), the network
# between nodes (e.g. 200 Gb/s InfiniBand per GPU; on CPU nodes what gloo gets over TCP).
_INTER_NODE_BYTES_S = {"cuda": 25e9, "cpu": 0.5e9}
_MICRO_STEP_S = {"cuda": 0.005, "cpu": 0.01}
_DEVICE_OPTIM_PARAMS_S = {"cuda": 2e10, "cpu": 2e8}  # Adam updates per second per rank
_CPU_ADAM_PARAMS_S = 5e8  # DeepSpeed's vectorised CPU Adam, per node
_HOST_LINK_BYTES_S = {"cuda": 12e9, "cpu": 5e9}  # PCIe / memcpy
_NVME_BYTES_S = 2e9

TERMS = (
    "compute_fp32",
    "compute_bf16",
    "compute_fp16",
    "micro_steps",
    "communication",
    "device_optimizer",
    "host_optimizer",
    "host_transfer",
    "nvme",
)
RIDGE = 0.3  # pull of each weight toward its prior 1, against relative errors
MIN_PROBES_FOR_ERROR = 3  # a leave-one-out error of fewer probes says nothing


@dataclass(frozen=True)
class WorkloadFacts:
    params: int
    tokens_per_sample: int
    #: parameters each token computes with, for FLOPs (None: all of ``params``)
    active_params: int | None = None

    @property
    def compute_params(self) -> int:
        return self.params if self.active_params is None else self.active_params

    @classmethod
    def of(cls, workload: Workload) -> WorkloadFacts:
        """The facts of a workload, from its model on the meta device."""
        from autotune.memory import model_facts

        facts = model_facts(workload, 0)
        return cls(facts.params, workload.tokens_per_sample, facts.active_params or None)


def measure_cpu_matmul_flops(precisions: tuple[str, ...], threads: int) -> dict[str, float]:
    """FLOP/s of a 256x256 matmul per precision on this CPU with ``threads`` threads (a
    short timed loop each). CPUs differ by more than any prior can cover: bf16 is emulated
    and much slower than fp32 on AVX2, but faster than fp32 with AMX (benchmarks/RESULTS.md,
    "Search efficiency"), and a cost model that assumes the wrong one never tries the
    winner."""
    import time

    import torch

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    rates: dict[str, float] = {}
    try:
        for precision in precisions:
            a = torch.randn(256, 256, dtype=dtypes[precision])
            b = torch.randn(256, 256, dtype=dtypes[precision])
            for _ in range(3):
                a @ b
            count, started = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - started) < 0.1:
                a @ b
                count += 1
            rates[precision] = count * 2 * 256**3 / elapsed
    finally:
        torch.set_num_threads(previous)
    return rates


def compute_scale_from(flops: dict[str, float]) -> dict[str, float]:
    """Measured matmul rates as factors on the nominal per-precision rates (fp32's nominal
    rate stays the anchor; calibration then fits the absolute scale)."""
    if "fp32" not in flops or flops["fp32"] <= 0:
        return {}
    nominal = _FLOPS[("cpu", "fp32")]
    return {p: rate / flops["fp32"] * nominal / _FLOPS[("cpu", p)] for p, rate in flops.items()}


def terms(
    candidate: Candidate,
    facts: WorkloadFacts,
    accelerator: str,
    threads: int,
    compute_scale: dict[str, float] | None = None,
    *,
    nodes: int = 1,
    tf32: bool = False,
    offloaded_bytes: float = 0.0,
) -> dict:
    """Each term's seconds per optimizer step at nominal rates (weights 1); ``compute_scale``
    multiplies a precision's nominal compute rate (this machine's measured ratio); ``nodes``:
    the nodes one probe's ranks span; ``tf32``: fp32 matmuls on TF32 tensor cores;
    ``offloaded_bytes``: the activations one micro-batch offloads to the host."""
    psi = float(facts.params)
    gas, dp = candidate.gradient_accumulation_steps, candidate.data_parallel_size
    width = 4.0 if candidate.precision == "fp32" else 2.0
    updated = psi if candidate.zero_stage == 0 else psi / dp
    ratio = candidate.offload_optimizer_ratio if candidate.offload_optimizer != "none" else 0.0
    device_optimizer = (1 - ratio) * updated / _DEVICE_OPTIM_PARAMS_S[accelerator]
    host_optimizer = ratio * updated / _CPU_ADAM_PARAMS_S * dp  # dp ranks share the host
    host = _HOST_LINK_BYTES_S[accelerator]
    host_transfer = ratio * updated * 2 * width / host
    nvme = 0.0
    if candidate.offload_optimizer == "nvme":
        nvme += ratio * updated * 12 * 2 / _NVME_BYTES_S  # fp32 states out and in
    if candidate.offload_param != "none":
        host_transfer += gas * 2 * psi / dp * width / host
        if candidate.offload_param == "nvme":
            nvme += gas * 2 * psi / dp * width / _NVME_BYTES_S
    host_transfer += gas * 2 * offloaded_bytes / host  # out in forward, back in backward
    values = dict.fromkeys(TERMS, 0.0)
    values[f"compute_{candidate.precision}"] = _compute_s(
        candidate, facts, accelerator, threads, compute_scale, tf32=tf32
    )
    values.update(
        micro_steps=gas * _MICRO_STEP_S[accelerator],
        communication=_communication_s(candidate, psi, accelerator, nodes=nodes, width=width),
        device_optimizer=device_optimizer,
        host_optimizer=host_optimizer,
        host_transfer=host_transfer,
        nvme=nvme,
    )
    return values


def _compute_s(
    candidate: Candidate,
    facts: WorkloadFacts,
    accelerator: str,
    threads: int,
    compute_scale: dict[str, float] | None,
    *,
    tf32: bool,
) -> float:
    """Forward and backward seconds per optimizer step: ~6 FLOPs per parameter and token,
    8 with every block's activations recomputed in full (the forward runs twice), in
    proportion between (the blocks hold nearly all the parameters). The selective policy
    recomputes no matmul, but its ops are not free: it is priced as a full recomputation,
    which it was not measurably faster than on CPU ranks (benchmarks/RESULTS.md, "What a
    selective recomputation costs"); the study's probes calibrate the rest."""
    rate = _FLOPS[(accelerator, candidate.precision)] * (threads if accelerator == "cpu" else 1)
    if tf32 and accelerator == "cuda" and candidate.precision == "fp32":
        rate = _TF32_FLOPS
    rate *= (compute_scale or {}).get(candidate.precision, 1.0)
    flops_per_token = 6.0 + 2.0 * candidate.checkpoint_fraction
    mb, gas = candidate.micro_batch_size, candidate.gradient_accumulation_steps
    return flops_per_token * float(facts.compute_params) * facts.tokens_per_sample * mb * gas / rate


def _communication_s(
    candidate: Candidate, psi: float, accelerator: str, *, nodes: int, width: float
) -> float:
    """Seconds per optimizer step moving gradients and parameters between the data-parallel
    ranks, by ZeRO stage, over the slowest link they use. Parameters are all-gathered at
    :data:`_LARGE_ALL_GATHER_BYTES_S` where a rank's partition of them exceeds
    :data:`_LARGE_ALL_GATHER_ABOVE_BYTES`: ZeRO-1/2 gather it whole once a step
    (DeepSpeed's ``all_gather_dp_groups`` sends it in one message wherever the backend has
    ``all_gather_into_tensor``, whatever ``allgather_bucket_size``); ZeRO-3 gathers a
    module at a time, its largest (an embedding, a wide block) growing with the model, for
    which the partition stands in."""
    gas, dp, stage = (
        candidate.gradient_accumulation_steps,
        candidate.data_parallel_size,
        candidate.zero_stage,
    )
    share = (dp - 1) / dp if dp > 1 else 0.0
    link = _LINK_BYTES_S[accelerator]
    if nodes > 1:
        link = min(link, _INTER_NODE_BYTES_S[accelerator])
    if stage == 0:
        elements, gathered = 2 * share * psi, 0.0
    elif stage == 1:
        elements, gathered = 2 * share * psi + share * psi, share * psi
    elif stage == 2:
        elements, gathered = gas * share * psi + share * psi, share * psi
    else:
        elements, gathered = gas * 3 * share * psi, gas * 2 * share * psi
    seconds = elements * width / link
    gather_link = _LARGE_ALL_GATHER_BYTES_S.get(accelerator, link)
    if psi / dp * width > _LARGE_ALL_GATHER_ABOVE_BYTES and gather_link < link:
        seconds += gathered * width * (1 / gather_link - 1 / link)  # at its own rate
    return seconds


def machine_cost_model(
    workload: Workload,
    accelerator: str,
    *,
    threads: int,
    precisions: tuple[str, ...],
    nodes: int,
    tf32: bool,
    facts: WorkloadFacts | None = None,
) -> tuple[CostModel, dict[str, float]]:
    """The cost model of ``workload`` (or of ``facts`` where given: a script's model as its
    probes reported it) on this machine, before any fit: on CPU its compute rates scaled by
    this CPU's measured matmul rates for ``precisions`` (fp32 anchors them); and those
    rates (empty elsewhere)."""
    flops: dict[str, float] = {}
    if accelerator == "cpu":
        flops = measure_cpu_matmul_flops(tuple(dict.fromkeys(("fp32", *precisions))), threads)
    model = CostModel(
        facts or WorkloadFacts.of(workload),  # active parameters for MoE and DiT
        accelerator,
        threads=threads,
        compute_scale=compute_scale_from(flops),
        nodes=nodes,
        tf32=tf32,
        offloaded_bytes=None if facts is not None else offloaded_activation_bytes(workload),
    )
    return model, flops


def offloaded_activation_bytes(workload: Workload) -> Callable[[Candidate, str], float]:
    """The bytes of activations one micro-batch of a candidate offloads to the host on
    an accelerator's kernels, from the memory model's trace (0 where it offloads none)."""

    def offloaded(candidate: Candidate, accelerator: str) -> float:
        if candidate.activation_offload == "none":
            return 0.0
        from autotune.memory.activations import profile

        return profile(
            workload,
            candidate.micro_batch_size,
            candidate.precision,
            candidate.checkpoint_fraction,
            "dropped",
            "cuda" if accelerator == "cuda" else "cpu",
            candidate.checkpoint_policy,
            candidate.activation_offload,
        ).offload_transfer_bytes

    return offloaded


class CostModel:
    """Predicts step time and samples/s; :meth:`fit` calibrates on measured probes."""

    def __init__(
        self,
        facts: WorkloadFacts,
        accelerator: str,
        threads: int = 1,
        compute_scale: dict[str, float] | None = None,
        *,
        nodes: int = 1,
        tf32: bool = False,
        offloaded_bytes: Callable[[Candidate, str], float] | None = None,
    ) -> None:
        self.facts = facts
        self.offloaded_bytes = offloaded_bytes  # None: no workload to trace (a script)
        self.accelerator = accelerator
        self.threads = max(1, threads)
        self.compute_scale = dict(compute_scale or {})
        self.nodes = max(1, nodes)
        self.tf32 = tf32
        self.weights = dict.fromkeys(TERMS, 1.0)
        self.observations = 0

    def terms(self, candidate: Candidate) -> dict[str, float]:
        return terms(
            candidate,
            self.facts,
            self.accelerator,
            self.threads,
            self.compute_scale,
            nodes=self.nodes,
            tf32=self.tf32,
            offloaded_bytes=(
                self.offloaded_bytes(candidate, self.accelerator) if self.offloaded_bytes else 0.0
            ),
        )

    def step_time_s(self, candidate: Candidate) -> float:
        values = self.terms(candidate)
        return sum(self.weights[k] * v for k, v in values.items())

    def samples_per_s(self, candidate: Candidate) -> float:
        return candidate.train_batch_size / max(self.step_time_s(candidate), 1e-12)

    def leave_one_out_error(self, measured: list[tuple[Candidate, float]]) -> float | None:
        """The median relative error of the samples/s predicted for each of ``measured``
        ((candidate, step time s) pairs) by the model fitted on the others: how far this
        study's own probes say its predictions can be trusted. None below
        :data:`MIN_PROBES_FOR_ERROR` probes. Leaves the model fitted on all of them."""
        if len(measured) < MIN_PROBES_FOR_ERROR:
            self.fit(measured)
            return None
        errors = []
        for index, (candidate, step_s) in enumerate(measured):
            self.fit(measured[:index] + measured[index + 1 :])
            errors.append(abs(step_s / self.step_time_s(candidate) - 1.0))
        self.fit(measured)
        errors.sort()
        middle = len(errors) // 2
        return errors[middle] if len(errors) % 2 else (errors[middle - 1] + errors[middle]) / 2

    def fit(self, measured: list[tuple[Candidate, float]]) -> None:
        """Weights from (candidate, measured step time) pairs: least squares on relative
        errors, each weight pulled toward 1 by :data:`RIDGE`, kept positive."""
        import numpy as np

        self.observations = len(measured)
        if not measured:
            self.weights = dict.fromkeys(TERMS, 1.0)
            return
        rows, targets = [], []
        for candidate, step_s in measured:
            values = self.terms(candidate)
            rows.append([values[k] / step_s for k in TERMS])
            targets.append(1.0)
        for index in range(len(TERMS)):
            prior = [0.0] * len(TERMS)
            prior[index] = RIDGE
            rows.append(prior)
            targets.append(RIDGE)
        a, b = np.array(rows), np.array(targets)
        weights = np.ones(len(TERMS))
        # Projected least squares: solve, clamp to a floor, re-solve the free ones.
        active = np.ones(len(TERMS), dtype=bool)
        for _ in range(len(TERMS)):
            solution, *_ = np.linalg.lstsq(a[:, active], b - a[:, ~active] @ weights[~active])
            weights[active] = solution
            low = weights < 0.02
            if not low.any():
                break
            weights[low] = 0.02
            active &= ~low
        self.weights = {k: float(w) for k, w in zip(TERMS, weights, strict=True)}
        # A precision no probe has measured keeps only its prior; what the probes taught about
        # compute on this machine (e.g. 3x slower than nominal) applies to it as well.
        seen = {f"compute_{c.precision}" for c, _ in measured}
        if seen:
            learned = math.exp(sum(math.log(self.weights[k]) for k in seen) / len(seen))
            for key in TERMS:
                if key.startswith("compute_") and key not in seen:
                    self.weights[key] = learned
