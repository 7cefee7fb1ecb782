"""Activation memory of a workload, traced on fake tensors: no GPU and no real memory.

The workload's real forward and backward run under PyTorch's ``FakeTensorMode`` (shapes and
dtypes only) with a :class:`~autotune.probe._memtrack.TensorMemoryTracker` on top, so the peak is
the same live-storage count the CPU probe measures, taken over the same operators. Two kinds
of trace exist, as DeepSpeed's stages treat gradients differently:

- ``kept``: gradients stay on their parameters (ZeRO 0-1); with ``accumulate`` a second
  micro-batch runs with the first one's gradients held, as in gradient accumulation;
- ``dropped``: each gradient is released as soon as it is produced (ZeRO 2-3 hooks move it
  into a reduction bucket).

One traced forward and backward gives both (the dropped count is the kept one less the
gradients held), and ``accumulate`` adds a second micro-batch to it. The same pass splits
backward where every block (the workload's shard units) has its gradients: the peak before
(counted as the whole backward's is), and the most backward holds after, with the gradients
outside the blocks held: a backend that shards per block reduces the blocks' gradients as
they come and keeps the rest until backward ends.

A trace is made for the accelerator the ranks run on (``target``). For ``cpu`` it runs the
CPU kernels the CPU ranks run. For ``cuda`` attention and dropout keep what CUDA's kernels
keep (:mod:`autotune.memory._cuda_kernels`: fused attention holds no sequence x sequence
matrix), and transformers' attention mask is made as for the real batch
(:func:`_unpacked_sequences`).

For a stack of identical blocks a trace is linear in the number of blocks: two short
stacks are traced and the line extrapolated, so a 70B model costs small traces. It is not
linear in the micro-batch (where the backward peak falls moves with it, with checkpointing
most of all), so each micro-batch is traced. Fake models are built once per stack depth,
dtype and checkpointing, and reused across micro-batches.

A model whose first k of n blocks are recomputed (a ``checkpoint_fraction`` between 0 and 1)
holds two kinds of block, each traced as it runs: recomputed blocks keep their input, kept
blocks all their activations, and backward recomputes one block at a time after the kept
ones are freed. Its peak is the largest of a few events (backward's start, a block's
recomputation, the loss), each linear in the count of each kind, so it is linear along a
line of fixed proportion once one event leads: the smallest stack of that proportion (k/g
recomputed of n/g, g their greatest common divisor) and twice it are traced, and the line
through them read at n; where twice that stack is the whole model, the whole is traced.

A model whose kept blocks offload their saved activations (``activation_offload`` cpu) is
traced with the offload's own hooks (:mod:`autotune.workloads.activation_offload`) packing to
the meta device: each packed tensor leaves the device count as soon as nothing else holds
it, and backward's unpacking allocates it again for the node that reads it, so the traced
peak holds what a GPU holds (a block's tensors in flight included); the hooks' ledger gives
the host's bytes (``ActivationProfile.offloaded_bytes``, pinned copies rounded as torch's
host allocator rounds them) and the bytes copied (``offload_transfer_bytes``), extrapolated
like the rest.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from autotune.backends import ActivationProfile

if TYPE_CHECKING:
    from autotune.workloads import Workload

# Stack depths traced for extrapolation.
TRACE_LAYERS = (1, 2)
Kind = Literal["kept", "accumulate", "dropped"]
Target = Literal["cpu", "cuda"]
# Which blocks a traced model recomputes: every one (True), none (False), or the first k of
# its n (``(k, n)``, :func:`autotune.workloads.checkpointing.checkpoint_leading_blocks`). A tuple,
# not an int: caches would take 1 for True.
Recomputed = bool | tuple[int, int]


def _dtype_name(precision: str) -> str:
    return "fp32" if precision == "fp32" else "bf16"  # fp16 and bf16 have equal sizes


class _FakeModel:
    """A workload's model on fake tensors, whose gradient hooks count the gradients held."""

    def __init__(
        self,
        workload: Workload,
        dtype_name: str,
        checkpointing: Recomputed,
        target: Target,
        policy: str = "full",
        offload: str = "none",
    ) -> None:
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        from autotune.workloads.activation_offload import OffloadLedger

        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
        self.workload = workload
        self.target = target
        self.mode = FakeTensorMode()
        self.first_grad: list[int] = []
        self.held: set[int] = set()
        self.pending_block_grads: set[int] = set()
        self.tracker: Any = None
        self.results: dict[tuple[int, str], ActivationProfile] = {}
        self.ledger = OffloadLedger()
        previous = torch.get_default_dtype()
        with self.mode:
            # Built in the target dtype: Module.to() cannot swap fake parameters in place.
            torch.set_default_dtype(dtype)
            try:
                self.model = workload.build_model()
            finally:
                torch.set_default_dtype(previous)
            # Read before recomputation or offload wrap any block.
            self.block_parameters = _block_parameter_ids(workload, self.model)
            if checkpointing is not False:
                from autotune.workloads.checkpointing import recompute

                blocks = None if checkpointing is True else checkpointing[0]
                recompute(workload, self.model, blocks, policy)
            if offload != "none":
                self._offload_kept_blocks(0 if checkpointing is False else checkpointing[0])
            self.model.train()
        self.parameters = list(self.model.parameters())
        for parameter in self.parameters:
            parameter.register_post_accumulate_grad_hook(self._on_grad)

    def _offload_kept_blocks(self, recomputed: int) -> None:
        """The blocks after the first ``recomputed`` pack their saved activations to the
        meta device: the device tensor is freed as a GPU's would be once copied to the host,
        unpacking allocates it again, and :attr:`ledger` counts the host's bytes."""
        from autotune.workloads.activation_offload import offload_blocks

        blocks = self.workload.checkpoint_blocks(self.model)
        offload_blocks(blocks[recomputed:], host="meta", ledger=self.ledger)

    def _on_grad(self, parameter: Any) -> None:
        tracker = self.tracker
        if tracker is None:
            return
        if not self.first_grad:
            self.first_grad.append(tracker.live_bytes)
        if id(parameter) not in self.held:
            self.held.add(id(parameter))
            tracker.hold(parameter.grad, in_block=id(parameter) in self.block_parameters)
        if self.pending_block_grads:
            self.pending_block_grads.discard(id(parameter))
            if not self.pending_block_grads:
                tracker.start_after_blocks()

    def trace(self, micro_batch_size: int, kind: Kind) -> ActivationProfile:
        from torch._subclasses.fake_tensor import DynamicOutputShapeException

        from autotune.errors import WorkloadError

        key = (micro_batch_size, kind)
        if key in self.results:
            return self.results[key]
        try:
            self.results.update(self._trace(micro_batch_size, kind == "accumulate"))
        except DynamicOutputShapeException as exc:
            raise WorkloadError(
                f"workload {self.workload.name!r}: its forward has shapes that depend on the "
                f"data ({exc.args[0] if exc.args else exc}), which a trace on fake tensors "
                "cannot follow (e.g. mixture-of-experts routing without transformers 5's "
                "grouped_mm experts); install transformers >= 5 or probe with --no-prune"
            ) from None
        finally:
            self.tracker = None
            for parameter in self.parameters:
                parameter.grad = None
        return self.results[key]

    def _without_gradients(self) -> None:
        """Every parameter without a gradient: none held, every block's to come."""
        self.first_grad = []
        self.held = set()
        self.pending_block_grads = set(self.block_parameters)
        for parameter in self.parameters:
            parameter.grad = None

    def _trace(
        self, micro_batch_size: int, accumulate: bool
    ) -> dict[tuple[int, str], ActivationProfile]:
        """One forward and backward with the gradients kept gives both ``kept`` and
        ``dropped``: releasing each gradient as its hook fires (what ZeRO 2-3 do) leaves
        every other allocation as it was, so the dropped live bytes are the kept ones less
        the gradients held so far. ``accumulate`` runs a second micro-batch on top."""
        import torch

        self._without_gradients()
        with (
            self.mode,
            _static_expert_shapes(),
            _kernels(self.target),
            _grad_aware_tracker() as tracker,
        ):
            # A fresh tracker counts what comes on top of the parameters (and of views of
            # them, which it must not take for new storages).
            tracker.ignore(self.parameters)
            self.tracker = tracker
            batch = self.workload.make_batch(micro_batch_size, torch.device("cpu"))
            self.ledger.peak_host_bytes = self.ledger.host_bytes
            packed_before = self.ledger.packed_bytes
            loss = self.workload.loss(self.model, batch)
            forward_peak = tracker.peak_bytes
            tracker.reset_peak()
            loss.backward()
            kept_peak, dropped_peak = tracker.peak_bytes, tracker.peak_without_held_bytes
            in_blocks = dict(zip(("kept", "dropped"), tracker.in_blocks_peaks_bytes(), strict=True))
            del loss
            first = self.first_grad[0] if self.first_grad else kept_peak
            common = {
                "forward_peak_bytes": forward_peak,
                "at_first_grad_bytes": first,
                "after_blocks_backward_peak_bytes": tracker.after_blocks_peak_bytes(),
            }
            transferred = float(self.ledger.packed_bytes - packed_before)
            offload = {
                "offloaded_bytes": float(self.ledger.peak_host_bytes),
                "offload_transfer_bytes": transferred,
            }
            results = {
                (micro_batch_size, kind): ActivationProfile(
                    backward_peak_bytes=peak,
                    in_blocks_backward_peak_bytes=in_blocks[kind],
                    **common,
                    **offload,
                )
                for kind, peak in (("kept", kept_peak), ("dropped", dropped_peak))
            }
            if accumulate:
                results[(micro_batch_size, "accumulate")] = self._second_micro_batch(
                    tracker, batch, results[(micro_batch_size, "kept")]
                )
            self.tracker = None
        return results

    def _second_micro_batch(
        self, tracker: Any, batch: Any, kept: ActivationProfile
    ) -> ActivationProfile:
        """``kept`` with a second micro-batch run on the first's gradients: its blocks get
        their gradients again (added into the first's) before its backward leaves them."""
        self.pending_block_grads = set(self.block_parameters)
        tracker.reset_peak()
        self.workload.loss(self.model, batch).backward()
        in_blocks = tracker.in_blocks_peaks_bytes()[0]
        return kept.model_copy(
            update={
                "backward_peak_bytes": float(max(kept.backward_peak_bytes, tracker.peak_bytes)),
                "in_blocks_backward_peak_bytes": float(
                    max(kept.in_blocks_backward_peak_bytes, in_blocks)
                ),
                "offloaded_bytes": float(self.ledger.peak_host_bytes),
            }
        )


def _block_parameter_ids(workload: Workload, model: Any) -> frozenset[int]:
    """Ids of the parameters in the workload's shard units (its blocks)."""
    from autotune.workloads.blocks import shard_units

    return frozenset(id(p) for unit in shard_units(workload, model) for p in unit.parameters())


def _grad_aware_tracker() -> Any:
    """A :class:`~autotune.probe._memtrack.TensorMemoryTracker` that also keeps the peak of live
    bytes less the gradients it was told are held (:meth:`hold`), both peaks as they were
    when every block has its gradients (:meth:`start_after_blocks`), and the peak less the
    blocks' held gradients from that moment on."""
    from autotune.probe import TensorMemoryTracker

    class GradAwareTracker(TensorMemoryTracker):
        def __init__(self) -> None:
            super().__init__()
            self.held_bytes = 0
            self.held_block_bytes = 0
            self.peak_without_held_bytes = 0
            self.peak_without_block_grads_bytes = 0
            self.after_blocks_bytes: int | None = None
            self.in_blocks_peaks: tuple[int, int] | None = None

        def hold(self, tensor: Any, *, in_block: bool = False) -> None:
            nbytes = tensor.untyped_storage().nbytes()
            self.held_bytes += nbytes
            if in_block:
                self.held_block_bytes += nbytes

        def start_after_blocks(self) -> None:
            self.in_blocks_peaks = (self.peak_bytes, self.peak_without_held_bytes)
            self.after_blocks_bytes = self.live_bytes - self.held_block_bytes

        def in_blocks_peaks_bytes(self) -> tuple[int, int]:
            """Both peaks until :meth:`start_after_blocks`, or since :meth:`reset_peak`
            where it never came (no blocks, or a block parameter without a gradient)."""
            return self.in_blocks_peaks or (self.peak_bytes, self.peak_without_held_bytes)

        def after_blocks_peak_bytes(self) -> int:
            """The peak since :meth:`start_after_blocks`; where it never came (no blocks, or
            a block parameter without a gradient), the peak since :meth:`reset_peak`, both
            less the blocks' held gradients."""
            if self.after_blocks_bytes is None:
                return self.peak_without_block_grads_bytes
            return self.after_blocks_bytes

        def _track(self, tensor: Any) -> None:
            super()._track(tensor)
            self.peak_without_held_bytes = max(
                self.peak_without_held_bytes, self.live_bytes - self.held_bytes
            )
            without_block_grads = self.live_bytes - self.held_block_bytes
            self.peak_without_block_grads_bytes = max(
                self.peak_without_block_grads_bytes, without_block_grads
            )
            if self.after_blocks_bytes is not None:
                self.after_blocks_bytes = max(self.after_blocks_bytes, without_block_grads)

        def reset_peak(self) -> None:
            super().reset_peak()
            self.peak_without_held_bytes = self.live_bytes - self.held_bytes
            self.peak_without_block_grads_bytes = self.live_bytes - self.held_block_bytes
            self.after_blocks_bytes = None
            self.in_blocks_peaks = None

    return GradAwareTracker()


@contextlib.contextmanager
def _static_expert_shapes() -> Iterator[None]:
    """Mixture-of-experts layers of transformers 5 (``experts_implementation="grouped_mm"``)
    sort the token-expert pairs by expert and multiply them in groups: shapes that do not
    depend on the routing, top-k rows per token, as on a GPU. PyTorch's grouped matmul has
    no fake-tensor rule for fp32, so the trace takes transformers' own fallback kernel,
    which has one and allocates the same outputs."""
    try:
        from transformers.integrations import moe
    except ImportError:  # transformers before 5: no grouped experts to trace
        yield
        return
    chooser = getattr(moe, "_can_use_grouped_mm", None)
    if chooser is None:
        yield
        return
    moe._can_use_grouped_mm = lambda *args, **kwargs: False
    try:
        yield
    finally:
        moe._can_use_grouped_mm = chooser


@contextlib.contextmanager
def _kernels(target: Target) -> Iterator[None]:
    """The kernels of ``target``: on CPU those the fake tensors take; for CUDA attention and
    dropout routed to CUDA's (:func:`autotune.memory._cuda_kernels.cuda_kernels`)."""
    if target == "cpu":
        yield
        return
    from autotune.memory._cuda_kernels import cuda_kernels

    with _unpacked_sequences(), cuda_kernels():
        yield


@contextlib.contextmanager
def _unpacked_sequences() -> Iterator[None]:
    """transformers (5) reads the position ids to learn whether a batch packs several
    sequences; on fake tensors it cannot, takes the batch as packed and passes SDPA an
    explicit B x 1 x L x L mask (``masking_utils.find_packed_sequence_indices``). On the
    real batch, whose positions run 0..L-1, it finds none packed and passes ``is_causal``
    instead, which is what lets CUDA pick flash attention (which takes no mask) and keeps
    that mask out of memory. The trace for CUDA answers as the real batch does."""
    try:
        from transformers import masking_utils
    except ImportError:  # no transformers: no such mask
        yield
        return
    finder = getattr(masking_utils, "find_packed_sequence_indices", None)
    if finder is None:
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = finder


@functools.lru_cache(maxsize=16)
def _fake_model(
    workload: Workload,
    dtype_name: str,
    checkpointing: Recomputed,
    target: Target,
    policy: str,
    offload: str,
) -> _FakeModel:
    return _FakeModel(workload, dtype_name, checkpointing, target, policy, offload)


@functools.lru_cache(maxsize=1024)
def _depth(workload: Workload) -> tuple[int | None, Any]:
    layers = getattr(workload, "num_layers", None)
    with_layers = getattr(workload, "with_layers", None)
    if layers is None or with_layers is None or layers <= max(TRACE_LAYERS):
        return None, None
    return layers, with_layers


def trace_once(
    workload: Workload,
    micro_batch_size: int,
    precision: str,
    checkpointing: Recomputed,
    kind: Kind = "kept",
    target: Target = "cpu",
    policy: str = "full",
    offload: str = "none",
) -> ActivationProfile:
    """One trace of the whole model (no extrapolation)."""
    model = _fake_model(workload, _dtype_name(precision), checkpointing, target, policy, offload)
    return model.trace(micro_batch_size, kind)


def profile(
    workload: Workload,
    micro_batch_size: int,
    precision: str,
    checkpoint_fraction: float,
    kind: Kind = "kept",
    target: Target = "cpu",
    policy: str = "full",
    offload: str = "none",
) -> ActivationProfile:
    """The activation profile of ``kind`` at a micro-batch on ``target``'s kernels with
    ``checkpoint_fraction`` of the blocks recomputed by ``policy`` and the saved activations
    of the others on ``offload`` (none: the device), extrapolated over blocks."""
    # fp16 and bf16 trace alike: one cache entry for both
    dtype_name = _dtype_name(precision)
    if checkpoint_fraction == 0:
        policy = "full"  # nothing recomputed: no policy
    if checkpoint_fraction in (0, 1):
        checkpointing = checkpoint_fraction == 1
        offload = "none" if checkpointing else offload  # every block recomputed: none kept
        return _profile(
            workload, micro_batch_size, dtype_name, checkpointing, kind, target, policy, offload
        )
    return _partial_profile(
        workload, micro_batch_size, dtype_name, checkpoint_fraction, kind, target, policy, offload
    )


@functools.lru_cache(maxsize=1024)
def _partial_profile(
    workload: Workload,
    micro_batch_size: int,
    dtype_name: str,
    checkpoint_fraction: float,
    kind: Kind,
    target: Target,
    policy: str,
    offload: str = "none",
) -> ActivationProfile:
    """The profile with the first k of n blocks recomputed; where k rounds to none or all
    of them, that profile."""
    from autotune.memory import _trace_cache as trace_cache
    from autotune.workloads.checkpointing import (
        checkpointed_block_count,
        partial_checkpointing_blocks,
    )

    layers, with_layers = _depth(workload)
    blocks = layers if layers is not None else partial_checkpointing_blocks(workload) or 0
    recomputed = checkpointed_block_count(checkpoint_fraction, blocks)
    if recomputed in (0, blocks):
        checkpointing = recomputed == blocks
        policy = policy if checkpointing else "full"
        offload = "none" if checkpointing else offload
        return _profile(
            workload, micro_batch_size, dtype_name, checkpointing, kind, target, policy, offload
        )
    name = trace_cache.entry_name(
        micro_batch_size, dtype_name, (recomputed, blocks), kind, target, policy, offload
    )
    args = (micro_batch_size, dtype_name)
    how = (kind, target, policy, offload)

    def traced() -> ActivationProfile:
        share = math.gcd(recomputed, blocks)
        unit, unit_recomputed = blocks // share, recomputed // share
        if layers is None or 2 * unit >= blocks:  # the whole model: no shorter stack
            return trace_once(workload, *args, (recomputed, blocks), *how)
        one = trace_once(with_layers(unit), *args, (unit_recomputed, unit), *how)
        two = trace_once(with_layers(2 * unit), *args, (2 * unit_recomputed, 2 * unit), *how)
        return _along(one, two, blocks / unit)

    return trace_cache.kept_or_made(workload, name, ActivationProfile, traced)


def _along(one: ActivationProfile, two: ActivationProfile, times: float) -> ActivationProfile:
    """Each field on the line through the stacks of one and two units, at ``times`` units."""
    values = {}
    for field in ActivationProfile.model_fields:
        low, high = getattr(one, field), getattr(two, field)
        values[field] = max(0.0, low + (high - low) * (times - 1))
    return ActivationProfile(**values)


@functools.lru_cache(maxsize=1024)
def _profile(
    workload: Workload,
    micro_batch_size: int,
    dtype_name: str,
    checkpointing: bool,
    kind: Kind,
    target: Target,
    policy: str = "full",
    offload: str = "none",
) -> ActivationProfile:
    """Kept on disk between runs where the workload has a fingerprint (:mod:`.trace_cache`)."""
    from autotune.memory import _trace_cache as trace_cache

    how = (kind, target, policy, offload)
    name = trace_cache.entry_name(micro_batch_size, dtype_name, checkpointing, *how)
    return trace_cache.kept_or_made(
        workload,
        name,
        ActivationProfile,
        lambda: _traced(workload, micro_batch_size, dtype_name, checkpointing, *how),
    )


def _traced(
    workload: Workload,
    micro_batch_size: int,
    dtype_name: str,
    checkpointing: bool,
    kind: Kind,
    target: Target,
    policy: str,
    offload: str,
) -> ActivationProfile:
    layers, with_layers = _depth(workload)
    args = (micro_batch_size, dtype_name, checkpointing, kind, target, policy, offload)
    if layers is None:
        return trace_once(workload, *args)
    short, longer = TRACE_LAYERS
    a = trace_once(with_layers(short), *args)
    b = trace_once(with_layers(longer), *args)
    values = {}
    for field in ActivationProfile.model_fields:
        low, high = getattr(a, field), getattr(b, field)
        values[field] = max(0.0, low + (high - low) * (layers - short) / (longer - short))
    return ActivationProfile(**values)
