"""Workloads for benchmarks on CPU: real model sizes with short sequences, so that CPU
probes finish (``--workload benchmarks/workloads.py:gpt2_seq32``), and models of other
shapes than a decoder (``benchmarks/workloads.py:dit_cpu``)."""

from __future__ import annotations

from autotune.workloads.dit import DiTWorkload
from autotune.workloads.transformers_lm import CausalLMWorkload, gpt2_like


def gpt2_seq32() -> CausalLMWorkload:
    """GPT-2 small (124M parameters) on 32-token sequences (bf16 is emulated on CPUs
    without AVX-512 BF16, ~10x slower than fp32: short sequences keep probes short)."""
    return gpt2_like("gpt2-seq32", layers=12, hidden=768, heads=12, seq_len=32, batch=4)


def dit_cpu() -> DiTWorkload:
    """A DiT of DiT-S's width at a quarter of its depth (3 blocks of hidden 384, 9M
    parameters) on a 16 x 16 x 4 latent at patch 2 (64 tokens), 10 classes: the patch
    embedding, adaLN modulation and diffusion loss of DiT, at a size whose CPU probes take
    seconds."""
    return DiTWorkload(
        "dit-cpu",
        layers=3,
        hidden=384,
        heads=6,
        patch=2,
        latent_size=16,
        num_classes=10,
        default_global_batch=16,
    )
