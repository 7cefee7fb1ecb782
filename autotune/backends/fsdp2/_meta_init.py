"""FSDP2's model without a whole copy on any rank: its parameters built on the meta device,
sharded by ``fully_shard``, then given memory shard by shard.

This is torchtitan's order (build on meta, ``fully_shard`` each block and the root,
``to_empty``, initialise) and the one torch's FSDP2 asks for under ``CPUOffloadPolicy``
("FSDP parameters should be materialized on CPU ...: call module.to_empty(device="cpu")",
``FSDPParamGroup._validate_cpu_offload_params``). ``fully_shard`` keeps meta parameters on
meta (``_move_states_to_device``), shards them there, and re-pads and pins each shard when
``to_empty`` gives it memory (``FSDPModule._apply``, ``FSDPParam.reset_sharded_param``).

Buffers are built as the model's code makes them (accelerate's
``init_empty_weights(include_buffers=False)``): values it computes in ``__init__``
(rotary frequencies, position tables, masks) are not in a state dict and would be lost by
``to_empty``, so they are kept through it.

Parameter values: a loss check (``autotune verify``) loads its seeded whole weights before
sharding (:func:`whole_on_host`); a probe's come from :func:`fill`, since a whole build to
copy them from is the very copy this avoids. A step's time and memory do not depend on
them, as long as they are finite and of the usual scale.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

# The standard deviation GPT-2 and Llama initialise their weight matrices with
# (``initializer_range`` of their transformers configs).
INIT_STD = 0.02


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Build models in fp32 with every parameter on the meta device: each one a module
    registers is moved there as it is registered (a tied parameter, registered again by a
    second module, is already there and stays the same object). Each is allocated on the
    default device for a moment first, as the module's code creates it."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(module: Any, name: str, param: Any) -> None:
        register(module, name, param)
        held = module._parameters[name]
        if held is not None and not held.is_meta:
            kind = type(held)
            module._parameters[name] = kind(held.to("meta"), requires_grad=held.requires_grad)

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]
        torch.set_default_dtype(previous)


def on_meta(model: Any) -> bool:
    """Whether any of ``model``'s parameters still lacks memory."""
    return any(param.is_meta for param in model.parameters())


def empty_parameters(model: Any, device: Any) -> None:
    """Give every parameter uninitialised memory on ``device`` (``to_empty``), keeping each
    buffer as it is (``to_empty`` would replace it with uninitialised memory too) and each
    tied parameter tied: a meta parameter is not swapped in place (``nn.Module._apply``
    swaps only where the new tensor's type allows a shallow copy, or for a DTensor), so
    each module that held it would get a copy of its own. Under ``fully_shard`` each rank
    allocates its shards only."""
    buffers = [
        (module, name, buffer)
        for module in model.modules()
        for name, buffer in module.named_buffers(recurse=False)
    ]
    params = [
        (module, name, param)
        for module in model.modules()
        for name, param in module.named_parameters(recurse=False, remove_duplicate=False)
    ]
    model.to_empty(device=device)
    for module, name, buffer in buffers:
        setattr(module, name, buffer)
    first: dict[int, Any] = {}
    for module, name, param in params:
        tied = first.setdefault(id(param), getattr(module, name))
        if getattr(module, name) is not tied:
            setattr(module, name, tied)


def whole_on_host(model: Any) -> contextlib.AbstractContextManager[Any]:
    """A context under which a model built by :func:`parameters_on_meta` holds its
    parameters whole on the host, uninitialised, for the caller to load (a loss check's
    seeded weights); ``fully_shard`` then moves each unit's shards to the device. A model
    with its parameters in memory already is left as it is."""
    import torch

    if on_meta(model):
        empty_parameters(model, torch.device("cpu"))
    return contextlib.nullcontext()


def fill(model: Any) -> None:
    """Values for a probe's parameters, written into each rank's shards: biases 0, other
    vectors (norm scales) 1, matrices normal with standard deviation :data:`INIT_STD`, as
    GPT-2's and Llama's own initialisation sets them."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            if name.endswith("bias"):
                local.zero_()
            elif param.dim() == 1:
                local.fill_(1.0)
            else:
                local.normal_(0.0, INIT_STD)
