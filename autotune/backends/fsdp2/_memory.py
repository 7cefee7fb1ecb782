"""The memory a rank holds under FSDP2 (``fully_shard``), by phase of a step.

FSDP2 keeps each parameter as a DTensor sharded over the ranks in the dtype the model was
built in (fp32), all-gathers a unit's shards in ``MixedPrecisionPolicy.param_dtype`` for
its forward and backward, reduce-scatters its gradients in ``reduce_dtype`` and keeps the
gradient shards in fp32 until the optimizer steps (PyTorch's FSDP2 design, torchtitan's
``docs/fsdp.md``; torch.distributed.fsdp ``FSDPParam``):

- between steps: fp32 parameter shards (4P/N) and AdamW's two fp32 states (8P/N), on the
  host with ``CPUOffloadPolicy``;
- forward: the root's own parameters gathered (the root never reshards after forward), the
  running block and the one prefetched; with ``reshard_after_forward=False`` every block
  stays gathered until its backward; one unit (``wrap: model``) is the whole model;
- backward: as forward, plus the largest unit's unsharded gradient (param dtype) and the
  flat reduce-scatter input it is copied into (reduce dtype) -- the root's, held from the
  output layer's gradient to the end of backward, where the root is largest -- the flat
  all-gather buffer of a block gathered again, and the fp32 gradient shards filling up
  (4P/N; on the host with CPU offload); with gradient accumulation the micro-batches
  before the last keep every unsharded gradient (no reduce-scatter until the last,
  ``set_requires_gradient_sync``);
- the optimizer step: the gradient shards and AdamW's temporaries (one more shard).

Checked against the probe's tracker on 2 CPU ranks (``benchmarks/memory_accuracy.py
--backend fsdp2``, RESULTS.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.backends._memory_terms import Breakdown

if TYPE_CHECKING:
    from autotune.backends._memory_terms import ActivationProfile, ModelFacts
    from autotune.candidate import Candidate

_WIDTH = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}


def fsdp_model_states(candidate: Candidate, facts: ModelFacts) -> tuple[Breakdown, Breakdown]:
    """Steady (device, host) model states per rank between optimizer steps: fp32
    parameter shards and AdamW's states (gradients are freed by ``zero_grad``)."""
    shard = float(facts.params) / candidate.data_parallel_size
    states = Breakdown(params=4.0 * shard, optimizer_states=8.0 * shard)
    if candidate.fsdp_cpu_offload:
        return Breakdown(), states
    return states, Breakdown()


def fsdp_transient_phases(
    candidate: Candidate,
    facts: ModelFacts,
    act: ActivationProfile,
    knobs: dict[str, int],
    host: Breakdown,
) -> tuple[dict[str, Breakdown], Breakdown]:
    """Bytes beyond the model states in each phase on the device, and the host's steady
    bytes with what an offloaded step adds there. ``knobs`` are DeepSpeed's: unused."""
    del knobs
    assert candidate.fsdp is not None
    p, n = float(facts.params), float(candidate.data_parallel_size)
    width = _WIDTH[candidate.precision]
    reduce_width = 4.0 if candidate.precision == "fp32" else _WIDTH[candidate.fsdp.reduce_dtype]
    gathered_forward, gathered_backward = _gathered(candidate, facts, width)
    largest_unit = _largest_unit(candidate, facts)
    # The largest unit's unsharded gradients and the flat reduce-scatter input they are
    # copied into; the root's are held from the start of backward (the output layer's
    # gradient comes first) until the root reduces last.
    unsharded_grads = (width + reduce_width) * largest_unit
    if reduce_width != width and candidate.fsdp.wrap == "block":
        # under mixed precision the gradient is cast to the reduce dtype before the copy
        # into the reduce-scatter input, while the root's stays held
        unsharded_grads += reduce_width * largest_unit
    if candidate.gradient_accumulation_steps > 1:
        unsharded_grads += max(reduce_width, width) * p  # kept unreduced until the last
    # A block resharded after forward is gathered again in backward, through a flat
    # all-gather buffer beside its unsharded parameters.
    regathered = candidate.fsdp.wrap == "block" and candidate.fsdp.reshard_after_forward
    gather_buffer = width * facts.largest_block_params if regathered is not False else 0.0
    grad_shards = 4.0 * p / n
    on_device = 0.0 if candidate.fsdp_cpu_offload else 1.0
    phases = {
        "forward": Breakdown(params=gathered_forward, activations=act.forward_peak_bytes),
        "backward": Breakdown(
            params=gathered_backward,
            grads=unsharded_grads + on_device * grad_shards,
            buckets=gather_buffer,
            activations=act.backward_peak_bytes,
        ),
        "optimizer step": Breakdown(
            grads=on_device * grad_shards, workspace=on_device * grad_shards
        ),
    }
    if candidate.fsdp_cpu_offload:  # the gradient shards land on the host in backward
        host = host.plus(Breakdown(grads=grad_shards))
    return phases, host


def _largest_unit(candidate: Candidate, facts: ModelFacts) -> float:
    """Parameters of the largest ``fully_shard`` unit: the whole model as one unit, else
    the larger of the largest block and the root's own parameters."""
    p = float(facts.params)
    if (candidate.fsdp is not None and candidate.fsdp.wrap == "model") or not facts.block_params:
        return p
    return max(float(facts.largest_block_params), p - facts.block_params)


def _gathered(candidate: Candidate, facts: ModelFacts, width: float) -> tuple[float, float]:
    """Gathered parameter bytes at the peak of forward and of backward."""
    assert candidate.fsdp is not None
    p = float(facts.params)
    if candidate.fsdp.wrap == "model" or not facts.block_params:
        return width * p, width * p
    root = width * (p - facts.block_params)
    in_flight = 2.0 * width * facts.largest_block_params  # running + prefetched
    reshard = candidate.fsdp.reshard_after_forward
    if reshard is False:
        return root + width * facts.block_params, root + width * facts.block_params
    if reshard is True:
        return root + in_flight, root + in_flight
    # An int: each block resharded after forward to groups of that many ranks.
    kept = width * facts.block_params / reshard
    return root + in_flight + kept, root + in_flight + kept
