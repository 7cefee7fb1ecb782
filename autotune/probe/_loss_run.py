"""A loss run on the rank (``ProbeSpec.loss_run``, for ``autotune verify``): the
candidate's engine trained from a fixed seed on a fixed global batch, each optimizer step's
loss recorded (:class:`~autotune.protocol.LossTrace`).

Every run of a loss check must start from the same weights and see the same samples in
each step, whatever its precision, ZeRO stage and split of the global batch:

- **Weights**: the model is built once whole, in fp32 on the CPU, after seeding torch, and
  its weights are copied into the candidate's model as the probe builds it (at ZeRO-3 under
  ``zero.Init``, where the workload's own initialisation would run on empty partitions and
  leave other weights than a whole build; under FSDP2, whose parameters are built on the
  meta device, into whole host parameters before ``fully_shard`` shards them onto the
  device). The fp32 weights' digest goes into the record;
  the rank checks that the candidate's model took them (their sum of squares differs only
  by the rounding to its dtype).
- **Samples**: the workload's batch of the whole global batch, made once on the CPU; rank r
  takes the samples ``[r·m·a, (r+1)·m·a)`` (micro-batch m, accumulation a) and its k-th
  micro-batch the k-th m of them. Every step trains on that same global batch, so the
  model learns it and the loss moves.
- **Randomness**: python's ``random``, numpy and torch are seeded before the first step;
  dropout is switched off (p = 0), and so is a DiT's class-label dropout, since their masks
  are drawn per micro-batch and two splits of the same batch would draw different ones.

The loss of a step is the mean of the micro-batch losses over accumulation and ranks, the
average whose gradient DeepSpeed steps with.
"""

from __future__ import annotations

import hashlib
import os
import random
from typing import Any

from autotune.probe._model_build import build_model, make_batch
from autotune.probe._rank_memory import dismantle
from autotune.probe._rank_process import start_candidate
from autotune.protocol import LossTrace, ProbeSpec, RankReport


def record_losses(spec: ProbeSpec, report: RankReport, device: Any) -> None:
    """Build the candidate's engine from the seeded weights, train ``spec.loss_run.steps``
    optimizer steps and put what they recorded on ``report``."""
    import torch

    from autotune.backends import get_backend
    from autotune.workloads import get_workload
    from autotune.workloads.blocks import shard_units

    assert spec.loss_run is not None
    backend = get_backend(spec.candidate.backend)
    start_candidate(spec, report, device)
    candidate, loss_run = spec.candidate, spec.loss_run
    workload = get_workload(spec.workload)
    source = seeded_weights(workload, loss_run.seed)
    model, report.build = build_model(workload, spec, device, backend)
    with backend.whole_parameters(model):
        model.load_state_dict(source)
        loaded_sq_sum = sq_sum(dict(model.named_parameters()))
    source_sq_sum = sq_sum({name: source[name] for name, _ in model.named_parameters()})
    _check_loaded(source_sq_sum, loaded_sq_sum, candidate.precision)
    dropouts = switch_off_dropout(model)
    model.train()
    engine = backend.initialize_engine(
        model, spec.backend_config, units=shard_units(workload, model)
    )
    batches = micro_batches(workload, candidate, int(os.environ.get("RANK", "0")), device)
    seed_everything(loss_run.seed)
    losses, norms, skipped = [], [], []
    for step in range(loss_run.steps):
        loss, was_skipped, norm = _train_step(
            engine, workload, batches, step == loss_run.inject_nan_at_step
        )
        losses.append(loss)
        skipped.append(was_skipped)
        norms.append(norm)
    report.loss_trace = LossTrace(
        losses=losses,
        grad_norms=norms,
        skipped=skipped,
        initial_weights_sha256=weights_digest(source),
        initial_weights_sq_sum=source_sq_sum,
        loaded_weights_sq_sum=loaded_sq_sum,
        batch_statistics=any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules()
        ),
        gradient_clipping=float(engine.gradient_clipping() or 0.0),
        dropout_modules=dropouts,
    )
    if hasattr(engine, "destroy"):
        engine.destroy()
    dismantle(engine, model)


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy and torch (every device's generator)."""
    import numpy
    import torch

    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)


def seeded_weights(workload: Any, seed: int) -> dict[str, Any]:
    """The workload's weights (and buffers) as a whole fp32 build on the CPU after
    seeding makes them: the same in every run and rank."""
    import torch

    seed_everything(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        with torch.device("cpu"):
            model = workload.build_model()
    finally:
        torch.set_default_dtype(previous)
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def switch_off_dropout(model: Any) -> int:
    """Set every dropout module's probability to 0, and every module's ``dropout_prob``
    (diffusers' ``LabelEmbedding``: the class label dropped for classifier-free guidance,
    drawn per micro-batch from torch's generator in training mode); how many there were."""
    import torch

    kinds = (
        torch.nn.Dropout,
        torch.nn.Dropout1d,
        torch.nn.Dropout2d,
        torch.nn.Dropout3d,
        torch.nn.AlphaDropout,
        torch.nn.FeatureAlphaDropout,
    )
    found = 0
    for module in model.modules():
        if isinstance(module, kinds):
            module.p = 0.0
            found += 1
        elif isinstance(getattr(module, "dropout_prob", None), float) and module.dropout_prob:
            module.dropout_prob = 0.0
            found += 1
    return found


def micro_batches(workload: Any, candidate: Any, rank: int, device: Any) -> list[Any]:
    """This rank's micro-batches of the global batch (see the module docstring)."""
    import torch

    whole = make_batch(
        workload, candidate.train_batch_size, torch.device("cpu"), candidate.precision
    )
    size, steps = candidate.micro_batch_size, candidate.gradient_accumulation_steps
    first = rank * size * steps
    return [
        _to(_samples(whole, first + k * size, first + (k + 1) * size), device) for k in range(steps)
    ]


def _samples(batch: Any, start: int, stop: int) -> Any:
    """Samples ``[start, stop)`` of every tensor in ``batch`` (its first dimension)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, dict):
        return {key: _samples(value, start, stop) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_samples(value, start, stop) for value in batch)
    return batch


def _to(batch: Any, device: Any) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device).contiguous()
    if isinstance(batch, dict):
        return {key: _to(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(value, device) for value in batch)
    return batch


def _train_step(
    engine: Any, workload: Any, batches: list[Any], inject_nan: bool
) -> tuple[float, bool, float | None]:
    """One optimizer step over this rank's micro-batches: the loss averaged over every
    micro-batch of every rank, whether the fp16 loss scaler skipped the step on any rank,
    and the step's gradient norm (:func:`grad_norm`)."""
    skipped_before = int(getattr(engine, "skipped_steps", 0))
    total = 0.0
    own_norm = None
    for batch in batches:
        loss = workload.loss(engine, batch)
        if inject_nan:
            loss = loss * float("nan")
        total += float(loss.detach().float().item())
        engine.backward(loss)
        if engine.is_gradient_accumulation_boundary():
            own_norm = module_grad_norm(engine.module)
        engine.step()
    skipped = int(getattr(engine, "skipped_steps", 0)) > skipped_before
    loss, skipped = mean_over_ranks(total / len(batches), skipped, engine.device)
    return loss, skipped, grad_norm(engine, own_norm)


def mean_over_ranks(loss: float, skipped: bool, device: Any) -> tuple[float, bool]:
    """``loss`` averaged over the ranks, and whether any rank's loss scaler skipped."""
    import torch
    import torch.distributed as dist

    agreed = torch.tensor([loss, float(skipped)], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        agreed = agreed.to(device)
        dist.all_reduce(agreed, op=dist.ReduceOp.SUM)
        agreed = agreed.cpu()
        agreed[0] /= dist.get_world_size()
    return float(agreed[0]), bool(agreed[1] > 0)


def grad_norm(engine: Any, own_norm: float | None) -> float | None:
    """The step's gradient norm before clipping: DeepSpeed's where it reports one (its ZeRO
    and 16-bit optimizers), else ``own_norm``, the module's gradients as the step found
    them (:func:`module_grad_norm`; fp32 at ZeRO-0, whose backward all-reduces them at the
    accumulation boundary)."""
    norm = engine.get_global_grad_norm()
    if norm is None:
        return own_norm
    return float(norm.item() if hasattr(norm, "item") else norm)


def module_grad_norm(module: Any) -> float | None:
    """The L2 norm of ``module``'s gradients, in float64 (None: it holds none, as at ZeRO-1
    and above, whose optimizer holds them)."""
    import torch

    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return None
    total = torch.zeros((), dtype=torch.float64)
    for grad in grads:
        if hasattr(grad, "full_tensor"):  # FSDP2's sharded gradient (a collective)
            grad = grad.full_tensor()
        total += grad.detach().to(device="cpu", dtype=torch.float64).pow(2).sum()
    return float(total.sqrt())


def sq_sum(tensors: dict[str, Any]) -> float:
    """Sum of squares of the floating-point tensors, in float64, each storage once."""
    import torch

    seen: set[int] = set()
    total = torch.zeros((), dtype=torch.float64)
    for tensor in tensors.values():
        if not tensor.is_floating_point() or id(tensor) in seen:
            continue
        seen.add(id(tensor))
        total += tensor.detach().to(device="cpu", dtype=torch.float64).pow(2).sum()
    return float(total)


def _check_loaded(source_sq_sum: float, loaded_sq_sum: float, precision: str) -> None:
    """The candidate's model holds the seeded weights: rounding each weight w to w(1 + d),
    |d| <= u (the unit roundoff of its dtype), moves a sum of squares by at most
    (2u + u²) of it."""
    import torch

    from autotune.probe._model_build import _target_dtype

    unit = torch.finfo(_target_dtype(precision)).eps / 2
    allowed = (2 * unit + unit * unit) * source_sq_sum + 1e-12 * max(source_sq_sum, 1.0)
    if abs(loaded_sq_sum - source_sq_sum) > allowed:
        raise RuntimeError(
            f"the candidate's model did not take the seeded weights (sum of squares "
            f"{loaded_sq_sum:.9g} against {source_sq_sum:.9g}); the loss comparison needs both "
            "runs to start from the same weights"
        )


def weights_digest(weights: dict[str, Any]) -> str:
    """SHA-256 of the weights' fp32 bytes, in name order."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(weights):
        value = weights[name].detach().cpu()
        if value.is_floating_point():
            value = value.to(torch.float32)
        digest.update(name.encode())
        digest.update(value.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
