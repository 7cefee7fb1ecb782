"""Traces for CUDA ranks keep what CUDA's kernels keep: checked against real CPU runs of the
same kernels (CPU flash attention forced, ``native_dropout``) measured with the probe's
tensor tracker, and by what grows with the sequence length."""

from __future__ import annotations

import math
from typing import Any

import pytest

from autotune.memory import _cuda_kernels as cuda
from autotune.memory.activations import trace_once
from autotune.probe import TensorMemoryTracker
from autotune.workloads import get_workload
from autotune.workloads.config_recipe import recipe
from autotune.workloads.transformers_lm import CausalLMWorkload

MICRO_BATCH = 2


def gpt_tiny(seq_len: int = 64, dropout: float = 0.1) -> CausalLMWorkload:
    """gpt-tiny (2 layers, 4 heads of 32) at ``seq_len``, with dropout ``dropout`` on the
    attention probabilities, the residuals and the embeddings (gpt-tiny's own: 0.1)."""
    config = recipe(
        "GPT2Config",
        "gpt2",
        "n_layer",
        n_layer=2,
        n_embd=128,
        n_head=4,
        n_positions=seq_len,
        vocab_size=4096,
        bos_token_id=0,
        eos_token_id=0,
        use_cache=False,
        attn_pdrop=dropout,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
    )
    name = f"gpt-tiny-{seq_len}-dropout{dropout}"
    return CausalLMWorkload(name, config, seq_len=seq_len, default_global_batch=16)


def _real_cpu_run(workload: Any, precision: str) -> tuple[int, int]:
    """Forward and backward peaks over the parameters of a real CPU step of ``workload``
    with SDPA held to the CPU flash kernel (it raises where that kernel cannot run), counted
    as the trace counts them."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = workload.build_model()
    finally:
        torch.set_default_dtype(previous)
    model.train()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), TensorMemoryTracker() as tracker:
        tracker.ignore(list(model.parameters()))
        batch = workload.make_batch(MICRO_BATCH, torch.device("cpu"))  # held, as a probe's
        loss = workload.loss(model, batch)
        forward = tracker.peak_bytes
        tracker.reset_peak()
        loss.backward()
        return forward, tracker.peak_bytes


def _fused_extra_bytes(precision: str, layers: int, heads: int, seq_len: int) -> int:
    """What the CUDA kernel traced keeps beyond the CPU flash kernel, per the kernels' meta
    functions: flash (16-bit) its dropout RNG state (two uint64 and one uint64); the
    memory-efficient kernel (fp32) its seed and offset (two int64) and a log-sum-exp padded
    to a multiple of 32 rows."""
    if precision == "bf16":
        return layers * (16 + 8)
    padded_rows = math.ceil(seq_len / 32) * 32 - seq_len
    return layers * (8 + 8 + MICRO_BATCH * heads * padded_rows * 4)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize(
    ("workload", "heads", "seq_len"),
    [(gpt_tiny(dropout=0.0), 4, 64), (get_workload("dit-tiny"), 4, 16)],
    ids=["gpt-tiny-no-dropout", "dit-tiny"],
)
def test_the_cuda_trace_matches_a_real_cpu_run_of_the_fused_kernel(
    workload: Any, heads: int, seq_len: int, precision: str
) -> None:
    """CPU flash attention keeps what CUDA's fused kernels keep (output and a B x H x L
    fp32 log-sum-exp): a real CPU step held to it measures what the CUDA trace predicts,
    but for the few bytes the CUDA kernels keep beside (their RNG state, the efficient
    kernel's padded log-sum-exp). Neither model has dropout, which CPU flash refuses."""
    real_forward, real_backward = _real_cpu_run(workload, precision)
    traced = trace_once(workload, MICRO_BATCH, precision, False, "kept", "cuda")
    extra = _fused_extra_bytes(precision, workload.num_layers, heads, seq_len)
    assert 0 <= traced.forward_peak_bytes - real_forward <= extra
    assert 0 <= traced.backward_peak_bytes - real_backward <= extra


def _second_differences(precision: str, target: str) -> tuple[float, float]:
    """Forward and backward peaks at sequences 64, 128 and 192: peak(192) - 2 peak(128) +
    peak(64), zero where nothing grows with the square of the sequence length."""
    peaks = [
        trace_once(gpt_tiny(seq_len), MICRO_BATCH, precision, False, "kept", target)
        for seq_len in (64, 128, 192)
    ]
    forward, backward = (
        [getattr(p, field) for p in peaks]
        for field in ("forward_peak_bytes", "backward_peak_bytes")
    )
    return (
        forward[2] - 2 * forward[1] + forward[0],
        backward[2] - 2 * backward[1] + backward[0],
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_cuda_trace_is_linear_in_the_sequence_and_the_cpu_trace_is_not(
    precision: str,
) -> None:
    """gpt-tiny with dropout (CUDA: flash in bf16, memory-efficient in fp32; CPU: the math
    path, which keeps the B x H x L x L probabilities, in fp32 also for bf16 inputs): the
    CUDA trace has no B x H x L^2 term, the CPU trace at least one fp32 matrix per layer,
    whose second difference over steps of 64 is B x H x 2 x 64^2 x 4 bytes."""
    assert _second_differences(precision, "cuda") == (0, 0)
    one_matrix_per_layer = 2 * MICRO_BATCH * 4 * 2 * 64**2 * 4
    forward, backward = _second_differences(precision, "cpu")
    assert forward >= one_matrix_per_layer and backward >= one_matrix_per_layer


def test_checkpointed_blocks_recompute_with_the_same_kernels() -> None:
    """Activation checkpointing recomputes the forward inside backward, where the routing
    must still hold (else the recomputation saves other tensors and checkpointing fails)."""
    workload = gpt_tiny()
    checkpointed = trace_once(workload, MICRO_BATCH, "bf16", True, "kept", "cuda")
    plain = trace_once(workload, MICRO_BATCH, "bf16", False, "kept", "cuda")
    assert 0 < checkpointed.forward_peak_bytes < plain.forward_peak_bytes


def _tensors(
    heads: tuple[int, int] = (4, 4), head_dim: int = 64, seq: tuple[int, int] = (128, 128), **kw
) -> tuple[Any, Any, Any]:
    import torch

    dtype = kw.get("dtype", torch.bfloat16)
    query = torch.empty(2, heads[0], seq[0], head_dim, dtype=dtype, device="meta")
    key = torch.empty(2, heads[1], seq[1], head_dim, dtype=dtype, device="meta")
    return query, key, key.clone()


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ({}, "flash"),
        ({"head_dim": 72}, "flash"),  # padded to 80 by the composite
        ({"fp32": True}, "efficient"),
        ({"mask": True}, "efficient"),
        ({"head_dim": 320}, "efficient"),  # over flash's 256
        ({"causal": True, "seq": (64, 128)}, "efficient"),  # flash: causal only if square
        ({"heads": (8, 2), "gqa": True}, "flash"),
        ({"heads": (8, 2), "gqa": True, "fp32": True}, "efficient"),
        ({"heads": (8, 2)}, "math"),  # grouped heads without enable_gqa
        ({"head_dim": 6, "fp32": True, "mask": True}, "math"),  # efficient: 4-aligned dims
        ({"head_dim": 20, "mask": True}, "math"),  # efficient: 8-aligned 16-bit dims
    ],
)
def test_the_backend_is_chosen_as_cuda_chooses_it(case: dict[str, Any], expected: str) -> None:
    import torch

    dtype = torch.float32 if case.get("fp32") else torch.bfloat16
    query, key, value = _tensors(
        case.get("heads", (4, 4)),
        case.get("head_dim", 64),
        case.get("seq", (128, 128)),
        dtype=dtype,
    )
    mask = torch.ones(2, 1, query.size(2), key.size(2), dtype=torch.bool, device="meta")
    chosen = cuda.cuda_sdpa_backend(
        query,
        key,
        value,
        mask if case.get("mask") else None,
        case.get("causal", False),
        case.get("gqa", False),
    )
    assert chosen == expected


def _saved_elements(node: Any) -> list[int]:
    """Elements of each storage an autograd node saves."""
    import torch

    values = [getattr(node, name) for name in dir(node) if name.startswith("_saved_")]
    return [
        v.untyped_storage().nbytes() // v.element_size()
        for v in values
        if isinstance(v, torch.Tensor)
    ]


@pytest.mark.parametrize(
    ("case", "node"),
    [
        ({}, "ScaledDotProductFlashAttentionBackward0"),
        ({"fp32": True}, "ScaledDotProductEfficientAttentionBackward0"),
        ({"mask": True}, "ScaledDotProductEfficientAttentionBackward0"),
    ],
)
def test_fused_kernels_keep_no_attention_matrix(case: dict[str, Any], node: str) -> None:
    """On fake tensors under the routing, the fused kernels' autograd nodes save nothing of
    B x H x L x S elements; with an explicit mask the memory-efficient kernel keeps it as an
    additive B x 1 x L x S tensor, as CUDA's does."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    batch, heads, seq = 2, 4, 128
    dtype = torch.float32 if case.get("fp32") else torch.bfloat16
    with FakeTensorMode(), cuda.cuda_kernels():
        query, key, value = (
            torch.empty(batch, heads, seq, 64, dtype=dtype, requires_grad=True) for _ in range(3)
        )
        mask = torch.ones(batch, 1, seq, seq, dtype=torch.bool) if case.get("mask") else None
        output = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=0.1
        )
        assert output.grad_fn.name() == node
        saved = _saved_elements(output.grad_fn)
    assert max(saved) < batch * heads * seq * seq
    assert (batch * seq * seq in saved) == bool(case.get("mask"))


def test_the_math_path_keeps_its_probabilities() -> None:
    """Where no fused kernel applies (head dimension 6 in fp32 with a mask), the routed
    math path keeps the B x H x L x S probabilities and a one-byte dropout mask of them."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), cuda.cuda_kernels(), TensorMemoryTracker() as tracker:
        query, key, value = (torch.empty(2, 4, 128, 6, requires_grad=True) for _ in range(3))
        mask = torch.ones(2, 1, 128, 128, dtype=torch.bool)
        start = tracker.live_bytes
        output = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=0.1
        )
        held = tracker.live_bytes - start
    matrix = 2 * 4 * 128 * 128
    assert output.grad_fn is not None
    assert held >= matrix * (4 + 1)  # fp32 probabilities and their bool dropout mask


def test_dropout_keeps_the_one_byte_mask_of_cudas_fused_kernel() -> None:
    """``native_dropout`` (CUDA's dropout) run for real on CPU saves a bool mask; traced
    under the routing, ``torch.nn.functional.dropout`` saves the same; CPU's own dropout
    saves a noise tensor in the input's dtype; real tensors under the routing, and every
    call after it, take the original."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    def saved(output: Any) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        node = output.grad_fn
        values = [getattr(node, n) for n in dir(node) if n.startswith("_saved_")]
        return [
            (node.name(), v.dtype, tuple(v.shape)) for v in values if isinstance(v, torch.Tensor)
        ]

    original = torch.nn.functional.dropout
    real = torch.ones(8, 16, dtype=torch.bfloat16, requires_grad=True)
    native = saved(torch.ops.aten.native_dropout(real, 0.1, True)[0])
    assert native == [("NativeDropoutBackward0", torch.bool, (8, 16))]
    with cuda.cuda_kernels():
        real_under_routing = saved(torch.nn.functional.dropout(real, 0.1, True))
        with FakeTensorMode() as fake_mode:
            routed = saved(torch.nn.functional.dropout(fake_mode.from_tensor(real), 0.1, True))
    assert torch.nn.functional.dropout is original
    with FakeTensorMode() as fake_mode:
        cpu_dropout = saved(torch.nn.functional.dropout(fake_mode.from_tensor(real), 0.1, True))
    assert routed == native
    assert cpu_dropout == [("MulBackward0", torch.bfloat16, (8, 16))]
    assert real_under_routing == cpu_dropout
