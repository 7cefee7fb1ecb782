"""The memory a rank holds under FSDP2 (``fully_shard``), by phase of a step.

FSDP2 keeps each parameter as a DTensor sharded over the ranks in the dtype the model was
built in (fp32), all-gathers a unit's shards in ``MixedPrecisionPolicy.param_dtype`` for
its forward and backward, reduce-scatters its gradients in ``reduce_dtype`` and keeps the
gradient shards in fp32 until the optimizer steps (PyTorch's FSDP2 design, torchtitan's
``docs/fsdp.md``; ``torch.distributed.fsdp._fully_shard``: ``FSDPParamGroup``,
``foreach_all_gather``, ``foreach_reduce``):

- between steps: fp32 parameter shards (4P/N) and AdamW's two fp32 states (8P/N), on the
  host with ``CPUOffloadPolicy``;
- forward, at its end (where the activations peak): the root's own parameters gathered (the
  root never reshards after forward), the blocks kept gathered (every block with
  ``reshard_after_forward=False``, a 1/k share of each for an int k, none for True), and the
  flat all-gather output of the last unit, which FSDP2 keeps until the next all-gather
  (``AllGatherState``); with one unit (``wrap: model``) that is the whole model twice; with
  gradient accumulation, the gradients of the micro-batches before; at world size 1 (torch
  2.9 on) there is no all-gather and no flat output: each shard is copied straight into its
  unsharded parameter (``FSDPParamGroup.unshard``/``wait_for_unshard``, PyTorch PR
  #160135);
- backward, in a block's backward: as forward without the flat output, plus the next block
  gathered ahead (prefetch) when blocks reshard, and the larger of two moments: the block
  gathered while it computes its unsharded gradients, or, once it is resharded (kept
  gathered or not), its gradients beside the flat reduce-scatter input they are copied into
  (``reduce_dtype``; a cast of them first under mixed precision); with gradient
  accumulation the micro-batches before the last keep every unsharded gradient (no
  reduce-scatter until the last, ``set_requires_gradient_sync``), already in the reduce
  dtype, so that the last casts none; reduced after each micro-batch
  (``sync_each_micro_batch``), they keep only the fp32 gradient shards (4P/N); with the
  activations backward holds until every block has its gradients
  (``ActivationProfile.in_blocks_backward_peak_bytes``): what comes after runs in the root
  backward below, every block resharded by then;
- backward after the blocks (the root's own backward: a GPT's embeddings, the tied one's
  gradient): every block resharded and its gradients reduced to fp32 shards (4/N bytes a
  block parameter; on the host with CPU offload), the root gathered with its unsharded
  gradients (the root's inputs need no gradient, so its ``post_backward`` waits for the
  final callback of autograd, ``FSDPState._root_post_backward_final_callback``), the last
  block's reduce-scatter input, which FSDP2 keeps until the next reduce-scatter or the
  final callback (``FSDPCommContext.reduce_scatter_states``), and the activations
  backward holds from there on (``ActivationProfile.after_blocks_backward_peak_bytes``);
- the end of backward: the last unit (the root, or the whole model as one unit) resharded,
  its unsharded gradients and reduce-scatter input, and the fp32 gradient shards (4P/N; on
  the host with CPU offload);
- the optimizer step: the gradient shards and AdamW's temporaries (one more shard).

Checked against the probe's tracker on 2 CPU ranks (``benchmarks/memory_accuracy/memory_accuracy.py
--backend fsdp2``, RESULTS.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.backends._memory_terms import Breakdown
from autotune.backends._torch_floor import installed_torch, torch_release

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
    width, reduce_width = _widths(candidate)
    unit, last_unit = _unit_params(candidate, facts)
    root, kept = _gathered_bytes(candidate, facts, width)
    reduced_each = _reduced_each(candidate)
    unsharded = _unreduced_accumulation(candidate)
    grad_shards = 4.0 * p / n
    on_device = 0.0 if candidate.fsdp_cpu_offload else grad_shards
    # What earlier micro-batches leave: every gradient unreduced, in the reduce dtype where
    # it is wider (``FSDPParam.to_accumulated_grad_if_needed``), or only the shards of
    # those reduced after each micro-batch.
    accumulated = max(reduce_width, width) * p if unsharded else 0.0
    earlier = accumulated + (on_device if reduced_each else 0.0)
    # A unit's unsharded gradients and the flat reduce-scatter input they are copied into;
    # under mixed precision, their cast to the reduce dtype first (none where the
    # accumulated gradients already are in it).
    cast = reduce_width if reduce_width != width and not unsharded else 0.0
    reducing = width + reduce_width + cast
    prefetched = width * unit if candidate.fsdp.reshard_after_forward is not False else 0.0
    phases = {
        "forward": Breakdown(  # a later micro-batch's forward holds the earlier's gradients
            params=root + kept,
            grads=earlier,
            buckets=width * unit if all_gathers(candidate) else 0.0,
            activations=act.forward_peak_bytes,
        ),
        "backward end": Breakdown(grads=reducing * last_unit + accumulated + on_device),
        "optimizer step": Breakdown(grads=on_device, workspace=on_device),
    }
    if _per_block(candidate, facts):  # a block's backward
        # Two moments, the larger counts: while the block computes, it is gathered with
        # its unsharded gradients; at the reduce-scatter's copy-in it is resharded already
        # (``FSDPParamGroup.post_backward`` reshards before ``foreach_reduce``) and the
        # gradients sit beside the flat input. A block kept gathered is freed there too.
        running = width * unit
        others_kept = kept - _kept_share(candidate, running)
        phases["backward"] = Breakdown(
            params=root + others_kept + prefetched,
            grads=max(running + width * unit, reducing * unit) + earlier,
            activations=act.in_blocks_backward_peak_bytes,  # the root's after: its own moment
        )
        phases.update(_root_moments(candidate, facts, act))
    else:  # one unit: gathered from the start of backward to its end
        phases["backward"] = Breakdown(
            params=root, grads=earlier, activations=act.backward_peak_bytes
        )
    if candidate.fsdp_cpu_offload:  # the gradient shards land on the host in backward
        host = host.plus(Breakdown(grads=grad_shards))
    return phases, host


def fsdp_host_phases(
    candidate: Candidate, facts: ModelFacts, host: Breakdown
) -> dict[str, Breakdown]:
    """The host by phase under CPU offload: the gradient shards land there as each unit is
    reduced, all of them by the end of backward. A block's backward peaks the device at
    the start of backward, before the shards of this micro-batch arrive; earlier
    micro-batches' shards (reduced after each) are there from their own backward on."""
    if not candidate.fsdp_cpu_offload:
        return {}
    grad_shards = 4.0 * facts.params / candidate.data_parallel_size
    before_reduction = host.plus(Breakdown(grads=grad_shards if _reduced_each(candidate) else 0.0))
    # after the blocks' backward, their shards of this micro-batch too (added into the
    # earlier ones' where those are kept)
    block_shards = 4.0 * facts.block_params / candidate.data_parallel_size
    after_blocks = host.plus(
        Breakdown(grads=grad_shards if _reduced_each(candidate) else block_shards)
    )
    return {
        "forward": before_reduction,
        "backward": before_reduction,
        "root backward": after_blocks,
    }


def all_gathers(candidate: Candidate, torch_version: str | None = None) -> bool:
    """Whether FSDP2 all-gathers into a flat output buffer: beyond one rank, and at one
    rank before torch 2.9 (``torch_version``: the installed torch's by default)."""
    if candidate.data_parallel_size > 1:
        return True
    release = torch_release(installed_torch() if torch_version is None else torch_version)
    return release is None or release < (2, 9)


def _reduced_each(candidate: Candidate) -> bool:
    """Whether earlier micro-batches of a step leave gradient shards (reduced after each)."""
    assert candidate.fsdp is not None
    return candidate.gradient_accumulation_steps > 1 and candidate.fsdp.sync_each_micro_batch


def _unreduced_accumulation(candidate: Candidate) -> bool:
    """Whether earlier micro-batches of a step leave every gradient unsharded (none
    reduced before the last)."""
    return candidate.gradient_accumulation_steps > 1 and not _reduced_each(candidate)


def _root_params(facts: ModelFacts) -> float:
    """Parameters of the root unit: those outside the blocks."""
    return float(facts.params - facts.block_params)


def _widths(candidate: Candidate) -> tuple[float, float]:
    """Bytes of a gathered parameter and of a gradient in the reduce-scatter."""
    assert candidate.fsdp is not None
    width = _WIDTH[candidate.precision]
    return width, 4.0 if candidate.precision == "fp32" else _WIDTH[candidate.fsdp.reduce_dtype]


def _root_moments(
    candidate: Candidate, facts: ModelFacts, act: ActivationProfile
) -> dict[str, Breakdown]:
    """The root's own backward, after every block's: in the last micro-batch
    (:func:`_root_backward`) and, where gradients accumulate unreduced, in one before it
    (:func:`_earlier_root_backward`)."""
    moments = {"root backward": _root_backward(candidate, facts, act)}
    if _unreduced_accumulation(candidate):
        moments["root backward, earlier micro-batch"] = _earlier_root_backward(
            candidate, facts, act
        )
    return moments


def _root_backward(candidate: Candidate, facts: ModelFacts, act: ActivationProfile) -> Breakdown:
    """The device in the root's own backward, after every block's: the root gathered, the
    gradients :func:`_after_blocks_gradients` counts, the last block's reduce-scatter input
    (the largest block's) and what backward holds after the blocks (the root's unsharded
    gradients with it)."""
    width, reduce_width = _widths(candidate)
    return Breakdown(
        params=width * _root_params(facts),
        grads=_after_blocks_gradients(candidate, facts, width, reduce_width)
        + reduce_width * facts.largest_block_params,
        activations=act.after_blocks_backward_peak_bytes,
    )


def _earlier_root_backward(
    candidate: Candidate, facts: ModelFacts, act: ActivationProfile
) -> Breakdown:
    """The device in the root's own backward in a micro-batch before the last where
    gradients are accumulated unsharded (none reduced yet): the root gathered, every
    block's unsharded gradients (in the reduce dtype where it is wider,
    ``FSDPParam.to_accumulated_grad_if_needed``), the root's own of the micro-batches
    before this one (from the third on), and what backward holds after the blocks (this
    micro-batch's root gradients with it). No reduce-scatter input: nothing is reduced."""
    width, reduce_width = _widths(candidate)
    accumulated_width = max(reduce_width, width)
    root_params = _root_params(facts)
    third_on = candidate.gradient_accumulation_steps > 2
    earlier_root = accumulated_width * root_params if third_on else 0.0
    return Breakdown(
        params=width * root_params,
        grads=accumulated_width * facts.block_params + earlier_root,
        activations=act.after_blocks_backward_peak_bytes,
    )


def _after_blocks_gradients(
    candidate: Candidate, facts: ModelFacts, width: float, reduce_width: float
) -> float:
    """Gradient bytes on the device once every block is reduced, before the root is: the
    blocks' fp32 shards (none on the device with CPU offload), every shard where earlier
    micro-batches were reduced after each (this one's added into them), and the root's
    unsharded gradients of earlier micro-batches where none were."""
    n = float(candidate.data_parallel_size)
    if candidate.fsdp_cpu_offload:
        shards = 0.0
    elif _reduced_each(candidate):
        shards = 4.0 * facts.params / n
    else:
        shards = 4.0 * facts.block_params / n
    unsharded = _unreduced_accumulation(candidate)
    return shards + (max(reduce_width, width) * _root_params(facts) if unsharded else 0.0)


def _kept_share(candidate: Candidate, gathered: float) -> float:
    """Of a block's gathered bytes, what stays gathered after its forward."""
    assert candidate.fsdp is not None
    reshard = candidate.fsdp.reshard_after_forward
    if reshard is True:
        return 0.0
    if reshard is False:
        return gathered
    return gathered / reshard  # resharded to groups of k ranks


def _unit_params(candidate: Candidate, facts: ModelFacts) -> tuple[float, float]:
    """Parameters of the unit gathered and reduced at a time (the largest block, or the
    whole model as one unit) and of the last one reduced (the root, or the whole model)."""
    p = float(facts.params)
    if not _per_block(candidate, facts):
        return p, p
    return float(facts.largest_block_params), p - facts.block_params


def _per_block(candidate: Candidate, facts: ModelFacts) -> bool:
    """Whether each block is a unit of its own (else the whole model is one)."""
    assert candidate.fsdp is not None
    return candidate.fsdp.wrap == "block" and facts.block_params > 0


def _gathered_bytes(candidate: Candidate, facts: ModelFacts, width: float) -> tuple[float, float]:
    """Gathered parameter bytes from forward to backward: the root's own (the whole model
    as one unit), and the blocks' kept after their forward."""
    assert candidate.fsdp is not None
    p = float(facts.params)
    if not _per_block(candidate, facts):
        return width * p, 0.0
    return width * (p - facts.block_params), _kept_share(candidate, width * facts.block_params)
