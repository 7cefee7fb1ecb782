"""What CUDA's kernels keep for backward, reproduced on the CPU fake tensors of a trace.

A trace (:mod:`autotune.memory.activations`) runs on CPU fake tensors, so PyTorch takes its
CPU kernels, and two of them keep for backward what CUDA's do not:

- attention: ``scaled_dot_product_attention`` on CPU runs the math path whenever the CPU
  flash kernel refuses (dropout, for one), which keeps the B x H x L x S attention
  probabilities (and its dropout noise) for backward; CUDA's fused kernels (flash,
  memory-efficient, cuDNN) keep the output and a B x H x L fp32 log-sum-exp, and never
  store an L x S matrix;
- dropout: CPU ``dropout`` multiplies by a noise tensor in the input's dtype and keeps it;
  CUDA's fused ``native_dropout`` keeps a one-byte mask.

:func:`cuda_kernels` routes both, for the time of a trace, to what CUDA runs. The SDPA
backend is chosen as PyTorch's CUDA dispatch chooses it
(``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, ``select_sdp_backend``) on an
sm80-or-newer device (A100, H100, H200), and the chosen branch of the composite
(``aten/src/ATen/native/transformers/attention.cpp``, ``scaled_dot_product_attention``) is
written out here with ATen's own CUDA attention ops: their meta functions
(``torch/_meta_registrations.py``) allocate what the CUDA kernels return, and their autograd
nodes (``tools/autograd/derivatives.yaml``) save what CUDA's save, on fake tensors of any
device. What the sketch of the choice leaves out:

- cuDNN attention, which PyTorch tries first on sm90/sm100 with cuDNN newer than 9.15, keeps
  the same tensors as flash (output, a B x H x L fp32 log-sum-exp, the additive mask when
  one is given), so it is traced as flash or memory-efficient;
- flash's head-dimension limits of sm86/sm89/sm120 (training with a head dimension over
  192), which the targeted devices do not have;
- grouped-query attention on the memory-efficient kernel (fp32): its keys and values are
  repeated to the query's heads first, as the math path does, which counts at most the
  repeated keys and values more than a kernel taking grouped heads keeps.

Kernel workspaces the CUDA kernels take from the caching allocator without returning them
(flash backward's fp32 accumulator of dq, cuBLAS's workspace) are not tensors of the
trace and are not counted.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

# scaled_dot_product_attention's arguments, in order.
SDPA_ARGUMENTS = (
    "query",
    "key",
    "value",
    "attn_mask",
    "dropout_p",
    "is_causal",
    "scale",
    "enable_gqa",
)
# Flash attention's largest head dimension (check_head_dim_size_flash).
FLASH_MAX_HEAD_DIM = 256
# The memory-efficient kernel's additive mask: strides aligned to this many elements
# (preprocess_mask), and flash's head dimension padded to a multiple of it (pad_last_dim).
ALIGNMENT = 8
# Held while torch.nn.functional's functions are replaced (cuda_kernels).
_ROUTING = threading.RLock()


def cuda_sdpa_backend(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> str:
    """``flash``, ``efficient`` or ``math``: the kernel PyTorch's CUDA dispatch picks on an
    sm80-or-newer device (cuDNN apart, see the module)."""
    import torch

    if not _fused_shapes(query, key, value, enable_gqa):
        return "math"
    half = query.dtype in (torch.float16, torch.bfloat16)
    head_q, head_k, head_v = query.size(-1), key.size(-1), value.size(-1)
    square = query.size(-2) == key.size(-2)
    if (
        attn_mask is None
        and half
        and head_q == head_k == head_v <= FLASH_MAX_HEAD_DIM
        and (square or not is_causal)
    ):
        return "flash"
    # minimum_gemm_alignment on sm80+: 128 bits of the dtype, at least 4 elements
    alignment = 8 if half else 4
    tensors = (query, key, value)
    if (
        (half or query.dtype == torch.float32)
        and head_q == head_k
        and head_q % alignment == 0
        and head_v % alignment == 0
        and all(t.storage_offset() % alignment == 0 for t in tensors)
    ):
        return "efficient"
    return "math"


def _fused_shapes(query: Any, key: Any, value: Any, enable_gqa: bool) -> bool:
    """The checks every fused kernel makes: 4-d dense inputs of one batch, the same heads
    (or grouped ones with ``enable_gqa``), non-empty sequences, unit stride on the head
    dimension."""
    tensors = (query, key, value)
    if any(t.dim() != 4 or t.is_nested for t in tensors):
        return False
    if not query.size(0) == key.size(0) == value.size(0):
        return False
    heads_q, heads_k, heads_v = query.size(1), key.size(1), value.size(1)
    grouped = enable_gqa and heads_k == heads_v and heads_q % heads_k == 0
    if not (heads_q == heads_k == heads_v or grouped):
        return False
    if query.size(-2) == 0 or key.size(-2) == 0:
        return False
    return all(t.stride(-1) == 1 for t in tensors)


def cuda_sdpa(*args: Any, **kwargs: Any) -> Any:
    """``scaled_dot_product_attention`` as the CUDA composite runs it."""
    bound = dict(zip(SDPA_ARGUMENTS, args, strict=False), **kwargs)
    query, key, value = bound["query"], bound["key"], bound["value"]
    attn_mask = bound.get("attn_mask")
    dropout_p = float(bound.get("dropout_p", 0.0))
    is_causal = bool(bound.get("is_causal", False))
    scale = bound.get("scale")
    enable_gqa = bool(bound.get("enable_gqa", False))
    backend = cuda_sdpa_backend(query, key, value, attn_mask, is_causal, enable_gqa)
    if backend == "flash":
        return _flash(query, key, value, dropout_p, is_causal, scale)
    if enable_gqa:
        key, value = _repeated_heads(query, key), _repeated_heads(query, value)
    mask = _additive_mask(attn_mask, query.dtype)
    if backend == "efficient":
        return _efficient(query, key, value, mask, dropout_p, is_causal, scale)
    return _math(query, key, value, mask, dropout_p, is_causal, scale)


def _flash(query: Any, key: Any, value: Any, dropout_p: float, is_causal: bool, scale: Any) -> Any:
    """The composite pads the head dimension to a multiple of 8 (the padded copies are what
    the kernel saves), scales by the unpadded one and slices the output back."""
    import torch

    size = query.size(-1)
    scale = scale if scale is not None else 1.0 / math.sqrt(size)
    padded = [_padded_last_dim(t) for t in (query, key, value)]
    out = torch.ops.aten._scaled_dot_product_flash_attention(
        *padded, dropout_p, is_causal, False, scale=scale
    )[0]
    return out[..., :size] if out.size(-1) != size else out


def _padded_last_dim(tensor: Any) -> Any:
    import torch

    size = tensor.size(-1)
    if size % ALIGNMENT == 0:
        return tensor
    return torch.nn.functional.pad(tensor, (0, ALIGNMENT - size % ALIGNMENT))


def _efficient(
    query: Any, key: Any, value: Any, mask: Any, dropout_p: float, is_causal: bool, scale: Any
) -> Any:
    """The mask is padded where its strides are not aligned and expanded (a view) to
    B x H x L x S; the kernel keeps it for backward."""
    import torch

    if mask is not None:
        aligned = mask.stride(-1) == 1 and all(
            mask.stride(i) % ALIGNMENT == 0 for i in range(mask.dim() - 1)
        )
        if not aligned:
            size = mask.size(-1)
            padding = ALIGNMENT - size % ALIGNMENT
            mask = torch.nn.functional.pad(mask, (0, padding))[..., :size]
        mask = mask.expand(query.size(0), query.size(1), query.size(2), key.size(2))
    with_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, mask, with_grad, dropout_p, is_causal, scale=scale
    )[0]


def _math(
    query: Any, key: Any, value: Any, mask: Any, dropout_p: float, is_causal: bool, scale: Any
) -> Any:
    """``_scaled_dot_product_attention_math``: 16-bit inputs computed in fp32 (unless
    16-bit reductions are allowed), the scores and probabilities materialised, dropout by
    CUDA's fused kernel."""
    import torch

    origin = query.dtype
    if origin in (torch.float16, torch.bfloat16) and not _reduced_math_allowed():
        query, key, value = query.float(), key.float(), value.float()
    scale = scale if scale is not None else 1.0 / math.sqrt(query.size(-1))
    factor = math.sqrt(abs(scale))
    query = query * (-factor if scale < 0 else factor)
    if is_causal:
        causal = torch.ones(
            query.size(-2), key.size(-2), dtype=torch.bool, device=query.device
        ).tril()
        mask = _additive_mask(causal, query.dtype)
    scores = torch.matmul(query, key.transpose(-2, -1) * factor)
    if mask is not None:
        scores.add_(mask)
    probabilities = torch.ops.aten._safe_softmax(scores, -1)
    if dropout_p > 0.0:
        probabilities = torch.ops.aten.native_dropout(probabilities, dropout_p, True)[0]
    return torch.matmul(probabilities, value).to(origin)


def _reduced_math_allowed() -> bool:
    import torch

    allowed = getattr(torch.backends.cuda, "fp16_bf16_reduction_math_sdp_allowed", None)
    return bool(allowed()) if callable(allowed) else False


def _repeated_heads(query: Any, tensor: Any) -> Any:
    groups = query.size(1) // tensor.size(1)
    return tensor if groups == 1 else tensor.repeat_interleave(groups, dim=1)


def _additive_mask(mask: Any, dtype: Any) -> Any:
    """A boolean mask as the additive one the kernels take (``convert_boolean_attn_mask``):
    a new tensor of the mask's shape in the query's dtype."""
    import torch

    if mask is None or mask.dtype != torch.bool:
        return mask
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask.logical_not(), -math.inf, zero)


def cuda_dropout(
    input: Any,  # torch.nn.functional.dropout's own name: callers may pass it by name
    p: float = 0.5,
    training: bool = True,
    inplace: bool = False,
) -> Any:
    """``torch.nn.functional.dropout`` as CUDA runs it: out of place in training with
    0 < p < 1, the fused kernel keeping a one-byte mask (``at::dropout``'s
    ``is_fused_kernel_acceptable``); otherwise as everywhere."""
    import torch

    if training and 0.0 < p < 1.0 and not inplace and input.numel() > 0:
        return torch.ops.aten.native_dropout(input, p, True)[0]
    return (torch.dropout_ if inplace else torch.dropout)(input, p, training)


@contextlib.contextmanager
def cuda_kernels() -> Iterator[None]:
    """While entered, ``torch.nn.functional``'s ``scaled_dot_product_attention`` and
    ``dropout`` keep on fake tensors what CUDA's kernels keep; real tensors (another
    thread's work) go to the originals. The module's functions are replaced rather than
    overridden by a ``TorchFunctionMode``: activation checkpointing recomputes the forward
    inside backward, where PyTorch restores dispatch modes but not function modes, and the
    recomputation must save what the forward saved. One thread at a time (a lock; the same
    thread may enter again)."""
    import torch.nn.functional as functional

    with _ROUTING:
        originals = functional.scaled_dot_product_attention, functional.dropout
        functional.scaled_dot_product_attention = _on_fake(cuda_sdpa, originals[0])
        functional.dropout = _on_fake(cuda_dropout, originals[1])
        try:
            yield
        finally:
            functional.scaled_dot_product_attention, functional.dropout = originals


def _on_fake(route: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``route`` for calls on fake tensors, ``original`` for the rest."""
    from torch._subclasses.fake_tensor import FakeTensor

    @functools.wraps(original)
    def routed(*args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else next(iter(kwargs.values()), None)
        return (route if isinstance(first, FakeTensor) else original)(*args, **kwargs)

    return routed
