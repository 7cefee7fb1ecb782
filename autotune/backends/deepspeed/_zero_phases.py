"""What DeepSpeed 0.19 allocates on top of the model states, phase by phase of a step.

:func:`transient_phases` gives, for each phase (forward, backward, the gradient reduction,
the optimizer step), the bytes a rank holds beyond its steady model states; the memory model
takes the largest. Each term was measured per stage and precision with the probe's tensor
tracker on 2 CPU ranks (GPT-2 124M, a 0.9M GPT-2, DiT-S/8 and DiT-S/2; see
``benchmarks/memory_accuracy/memory_accuracy.py``) and read in DeepSpeed's code where it
names a buffer:

- ZeRO 1-2 reduce gradients through a bucket of ``reduce_bucket_size`` elements (default
  5e8, 1.9 GB in fp32) allocated in backward; ZeRO-3 keeps it for the whole run.
- Reducing the bucket flattens its gradients into one more buffer (ZeRO-2:
  ``allreduce_bucket``; ZeRO-3: ``reduce_scatter_coalesced``): once at the end of backward
  for a model under the bucket size, whenever the bucket fills for a larger one.
- With gradient accumulation ZeRO 0-1 keep each parameter's gradient across micro-batches
  (the next one's gradient briefly exists beside it: traced), and ZeRO-2 keeps the rank's
  reduced gradient partition (width x P/N; on the host with optimizer offload).
- ZeRO 0 in fp32 all-reduces gradients through flattened copies of at most 5e8 elements.
- ZeRO 0 in bf16 runs DeepSpeed's BF16_Optimizer, which keeps an fp32 gradient buffer of
  the whole model next to bf16 gradients.
- ZeRO-3 with the default ``stage3_max_live_parameters`` (1e9) and reuse distance keeps
  every gathered parameter until backward, parameters under
  ``stage3_param_persistence_threshold`` (1e5) are never partitioned, the tied embedding
  is gathered once more, and from the second step the forward prefetches up to
  ``stage3_prefetch_bucket_size`` elements beside what is gathered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.backends._memory_terms import Breakdown
from autotune.protocol import PERSISTENCE_THRESHOLD

if TYPE_CHECKING:
    from autotune.backends._memory_terms import ActivationProfile, ModelFacts
    from autotune.candidate import Candidate

DEFAULT_REDUCE_BUCKET = 500_000_000  # DeepSpeedZeroConfig.reduce_bucket_size
DEFAULT_ALLREDUCE_BUCKET = 500_000_000  # engine.allreduce_gradients, MEMORY_OPT_ALLREDUCE_SIZE
DEFAULT_PERSISTENCE_THRESHOLD = PERSISTENCE_THRESHOLD  # stage3_param_persistence_threshold
DEFAULT_MAX_LIVE = 1_000_000_000  # stage3_max_live_parameters
DEFAULT_PREFETCH_BUCKET = 50_000_000  # stage3_prefetch_bucket_size


def transient_phases(
    candidate: Candidate,
    facts: ModelFacts,
    act: ActivationProfile,
    knobs: dict[str, int],
    host: Breakdown,
) -> tuple[dict[str, Breakdown], Breakdown]:
    """Bytes on the device beyond the model states in each phase, and the host's steady
    bytes with what the offloaded optimizer step adds there."""
    p = float(facts.params)
    width = 4.0 if candidate.precision == "fp32" else 2.0
    stage = candidate.zero_stage
    if stage == 0:
        phases = _zero0(candidate, p, act)
    elif stage in (1, 2):
        phases, host = _zero12(candidate, p, act, knobs["reduce_bucket_size"], host)
    else:
        phases = _zero3(candidate, facts, act, knobs)
    if candidate.offload_optimizer != "none" and stage >= 1:
        # The optimizer steps on the host: its transient moves there, and the device only
        # receives the updated parameter partition (to the host as well when parameters
        # live there).
        ratio = candidate.offload_optimizer_ratio
        step = phases["step"]
        host = host.plus(Breakdown(workspace=step.total * ratio))
        received = 0.0 if candidate.offload_param != "none" else width * p / _ranks(candidate)
        phases["step"] = Breakdown(workspace=step.total * (1 - ratio) + received)
    return phases, host


def _ranks(candidate: Candidate) -> float:
    return float(candidate.data_parallel_size)


def _zero0(candidate: Candidate, p: float, act: ActivationProfile) -> dict[str, Breakdown]:
    if candidate.precision == "fp32":
        flat = 4.0 * min(p, DEFAULT_ALLREDUCE_BUCKET)
        grads_and_flat = 4.0 * p + flat
        return {
            "backward": Breakdown(
                activations=act.backward_peak_bytes,
                workspace=max(0.0, grads_and_flat - act.backward_peak_bytes),
            ),
            "step": Breakdown(grads=4.0 * p),
        }
    return {
        "backward": Breakdown(
            activations=act.backward_peak_bytes,
            workspace=max(0.0, 4.0 * p - act.backward_peak_bytes),
        ),
        # measured at 2 ranks (benchmarks/RESULTS.md): fp32 partition updates, taken to scale
        # with them
        "step": Breakdown(workspace=20.0 * p / _ranks(candidate)),
    }


def _zero12(
    candidate: Candidate, p: float, act: ActivationProfile, bucket_elements: int, host: Breakdown
) -> tuple[dict[str, Breakdown], Breakdown]:
    width = 4.0 if candidate.precision == "fp32" else 2.0
    n = _ranks(candidate)
    offloaded = candidate.offload_optimizer != "none"
    backward = Breakdown(activations=act.backward_peak_bytes, buckets=width * bucket_elements)
    phases = {"backward": backward, "step": Breakdown(workspace=9.0 * p / n)}  # at 2 ranks
    if candidate.zero_stage == 2 and candidate.gradient_accumulation_steps > 1:
        # ZeRO-2 holds the rank's reduced gradient partition (grads_in_partition) from one
        # micro-batch to the next (stage_1_and_2.py: accumulated in the gradient
        # accumulation dtype, the model's by default), on the host with optimizer offload.
        # Measured on GPT-2 124M fp32 at 2 ranks, mb1x2 against mb2x1: what 4 B x P/N
        # predicts (benchmarks/RESULTS.md).
        held = width * p / n
        if offloaded:
            host = host.plus(Breakdown(grads=held))
        else:
            backward.grads += held
    # The reduction at the end of backward (reduce_ipg_grads) flattens the bucket's
    # gradients into one more buffer per destination rank for the reduce, beside the
    # gradient partition ZeRO-2 holds from the micro-batch before (measured on DiT-S and
    # DiT-B/8 at mb2x4 and mb4x2: the peak is that partition plus the flattened buffers).
    # Then 16-bit ZeRO allocates the rank's partition, after the flattened buffers are
    # released. On CPU ranks gloo's worker thread sometimes releases them late, so that
    # both exist at once (+ width x P/N on one rank: seen in a few bf16 ZeRO-1 probes of
    # DiT-S, never in DiT-B/8 or GPT-2 ones; benchmarks/RESULTS.md). That transient is not
    # predicted: the screen's margin (5% by default) is there for it; predicting it
    # over-predicted every probe where it did not happen (DiT-B/8 most).
    flat = width * min(p, bucket_elements)
    phases["reduce"] = Breakdown(grads=backward.grads, buckets=backward.buckets, workspace=flat)
    if p > bucket_elements:  # a full bucket is reduced during backward
        phases["backward"] = backward.plus(Breakdown(workspace=flat))
    return phases, host


def _zero3(
    candidate: Candidate, facts: ModelFacts, act: ActivationProfile, knobs: dict[str, int]
) -> dict[str, Breakdown]:
    p = float(facts.params)
    width = 4.0 if candidate.precision == "fp32" else 2.0
    # Parameters gathered for compute stay until backward (default live limit and reuse
    # distance), plus the tied embedding gathered once more.
    live = knobs["stage3_max_live_parameters"]
    gathered = width * (min(p, live) + facts.largest_param - facts.small_params)
    # From the second step on, the forward prefetches the next parameters by the recorded
    # trace beside those still gathered (measured on DiT-S/2, 40M parameters under the 5e7
    # default: one more gathered copy of the model at the forward's peak).
    prefetch = width * min(p - facts.small_params, knobs["stage3_prefetch_bucket_size"])
    # Reducing the bucket flattens its gradients for the reduce-scatter: at the end of
    # backward, or whenever the bucket fills for a model larger than it, beside the
    # activations still held (measured on GPT-2 124M and DiT-S/8).
    bucket_elements = knobs["reduce_bucket_size"]
    flat = width * min(p, bucket_elements)
    during_backward = flat if p > bucket_elements else 0.0
    return {
        "forward": Breakdown(
            params=gathered, activations=act.forward_peak_bytes, workspace=prefetch
        ),
        "backward": Breakdown(
            params=gathered, activations=act.backward_peak_bytes, workspace=during_backward
        ),
        "reduce": Breakdown(params=gathered, workspace=flat),
        # measured at 2 ranks (benchmarks/RESULTS.md): partition-sized updates
        "step": Breakdown(
            workspace=(4.0 if candidate.precision == "fp32" else 6.0) * p / _ranks(candidate)
        ),
    }


def host_phases(candidate: Candidate, facts: ModelFacts, host: Breakdown) -> dict[str, Breakdown]:
    """None apart: the offloaded states and the host optimizer's workspace are counted at
    the host's peak in every phase."""
    del candidate, facts, host
    return {}
