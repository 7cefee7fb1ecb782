"""FSDP2 on a probe's rank: ``fully_shard`` applied to the model as the config says
(:func:`initialize_engine`), and the engine the probe times (:class:`Fsdp2Engine`), which
keeps DeepSpeed's engine contract: ``backward`` and ``step`` after every micro-batch, the
optimizer stepping at the accumulation boundary."""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

from autotune.backends.fsdp2 import _meta_init
from autotune.backends.fsdp2._config import Fsdp2Config, optimizer_class
from autotune.protocol import ShardingState
from autotune.workloads.blocks import block_units

_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class Fsdp2Engine:
    """A model under ``fully_shard`` and its optimizer. Gradients are reduced on the last
    micro-batch of an optimizer step only (``set_requires_gradient_sync``, as accelerate
    accumulates under FSDP2), or after each with ``sync_each_micro_batch``; the loss is
    divided by the accumulation steps, as DeepSpeed's engine does."""

    def __init__(
        self,
        module: Any,
        optimizer: Any,
        accumulation_steps: int,
        clipping: float = 0.0,
        sync_each_micro_batch: bool = False,
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        self.clipping = clipping
        self.sync_each_micro_batch = sync_each_micro_batch
        self.micro_steps = 0
        # Whether the first micro-batch of a step left gradient shards (it was reduced),
        # read from the parameters once; None until a step accumulates.
        self.first_micro_batch_reduced: bool | None = None

    @property
    def device(self) -> Any:
        import torch

        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the next :meth:`step` steps the optimizer."""
        return self.micro_steps + 1 == self.accumulation_steps

    def gradient_clipping(self) -> float:
        return self.clipping

    def get_global_grad_norm(self) -> None:
        """None: the loss check reads the norm of the module's gradients itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # parameters(), dtype ... of the model
        return getattr(self.__dict__["module"], name)

    def backward(self, loss: Any) -> None:
        last = self.micro_steps + 1 == self.accumulation_steps
        self.module.set_requires_gradient_sync(last or self.sync_each_micro_batch)
        (loss / self.accumulation_steps).backward()
        if self.first_micro_batch_reduced is None and self.micro_steps == 0 and not last:
            self.first_micro_batch_reduced = any(
                p.grad is not None for p in self.module.parameters()
            )

    def sharding_state(self) -> ShardingState:
        """How ``fully_shard`` sharded the model, read from its FSDP2 states (the units'
        param groups: their mixed-precision and offload policies, whether they reshard
        after forward and over how many ranks)."""
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in self.module.modules() if isinstance(m, FSDPModule)]
        groups = [unit._get_fsdp_state()._fsdp_param_group for unit in units]
        resharded = [g.post_forward_mesh_info for g in groups if g and g.post_forward_mesh_info]
        root = self.module._get_fsdp_state()._fsdp_param_group
        shard = next(iter(self.module.parameters()))
        return ShardingState(
            units=len(units),
            resharded_units=len(resharded),
            post_forward_ranks=resharded[0].shard_mesh_size if resharded else 0,
            param_dtype=str(root.mp_policy.param_dtype).removeprefix("torch."),
            reduce_dtype=str(root.mp_policy.reduce_dtype).removeprefix("torch."),
            offload=type(root.offload_policy).__name__,
            shard_device=str(shard.to_local().device.type),
            checkpointed=any(
                getattr(m, "gradient_checkpointing", False) is True for m in self.module.modules()
            ),
            first_micro_batch_reduced=self.first_micro_batch_reduced,
        )

    def step(self) -> None:
        self.micro_steps += 1
        if self.micro_steps == self.accumulation_steps:
            if self.clipping > 0:
                import torch

                torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.clipping)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.micro_steps = 0


def start_process_group() -> None:
    """Join the ranks' process group from torchrun's environment: on CUDA with NCCL and
    gloo beside it (offloaded shards are host tensors), else gloo (FSDP2's collectives run
    on both); :mod:`autotune.backends._process_group`."""
    import torch
    import torch.distributed as dist

    from autotune.backends._process_group import process_group_backend

    if not dist.is_initialized():
        accelerator = "cuda" if torch.cuda.is_available() else "cpu"
        dist.init_process_group(process_group_backend(accelerator))


def initialize_engine(
    model: Any, config: dict[str, Any], units: list[Any] | None = None
) -> Fsdp2Engine:
    """``fully_shard`` over ``model``'s units (``units``, inner first, else its blocks;
    then the root; or the root alone) with the config's policies, each rank's shards given
    memory where the model was built with its parameters on meta (:mod:`._meta_init`), and
    its optimizer over the sharded parameters."""
    import torch

    parsed = Fsdp2Config.model_validate(config)
    shard = fully_shard_arguments(parsed)
    from torch.distributed.fsdp import fully_shard

    if parsed.fully_shard.wrap == "block":
        for unit in block_units(model) if units is None else units:
            fully_shard(unit, **shard)
    # The root is left to FSDP2's default (None): it keeps its parameters gathered from
    # forward to backward, which would gather them again at once.
    fully_shard(model, **{**shard, "reshard_after_forward": None})
    if _meta_init.on_meta(model):
        _meta_init.empty_parameters(model, _shard_device(parsed))
        _meta_init.fill(model)
    kind = getattr(torch.optim, optimizer_class(parsed.optimizer))
    accepted = inspect.signature(kind).parameters
    params = {k: v for k, v in parsed.optimizer.get("params", {}).items() if k in accepted}
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = kind(trainable, **params)
    return Fsdp2Engine(
        model,
        optimizer,
        parsed.gradient_accumulation_steps,
        parsed.gradient_clipping,
        parsed.sync_each_micro_batch,
    )


def _shard_device(config: Fsdp2Config) -> Any:
    """Where a rank's shards live: the host under CPU offload, else the rank's device."""
    import torch

    if config.fully_shard.cpu_offload or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def fully_shard_arguments(config: Fsdp2Config) -> dict[str, Any]:
    """The keyword arguments of ``fully_shard`` the config states."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    settings = config.fully_shard
    mixed = MixedPrecisionPolicy(
        param_dtype=getattr(torch, _TORCH_DTYPES[settings.param_dtype]),
        reduce_dtype=getattr(torch, _TORCH_DTYPES[settings.reduce_dtype]),
    )
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    return {
        "reshard_after_forward": settings.reshard_after_forward,
        "mp_policy": mixed,
        "offload_policy": offload if settings.cpu_offload else OffloadPolicy(),
    }


def whole_parameters(model: Any) -> contextlib.AbstractContextManager[Any]:
    """A context under which every parameter is whole: the model a probe builds has its
    parameters on the meta device until :func:`initialize_engine` shards them, so they are
    made whole on the host here, for the caller to load (:func:`._meta_init.whole_on_host`)."""
    return _meta_init.whole_on_host(model)
