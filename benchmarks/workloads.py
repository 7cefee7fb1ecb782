"""Workloads for benchmarks on CPU: real model sizes with short sequences, so that CPU
probes finish (``--workload benchmarks/workloads.py:gpt2_seq32``)."""

from __future__ import annotations

from autotune.workloads.transformers_lm import CausalLMWorkload, gpt2_like


def gpt2_seq32() -> CausalLMWorkload:
    """GPT-2 small (124M parameters) on 32-token sequences (bf16 is emulated on CPUs
    without AVX-512 BF16, ~10x slower than fp32: short sequences keep probes short)."""
    return gpt2_like("gpt2-seq32", layers=12, hidden=768, heads=12, seq_len=32, batch=4)
