"""Workloads for benchmarks on CPU: real model sizes with short sequences, so that CPU
probes finish (``--workload benchmarks/workloads.py:gpt2_seq32``)."""

from __future__ import annotations

from autotune.workloads.transformers_lm import CausalLMWorkload


def gpt2_seq32() -> CausalLMWorkload:
    """GPT-2 small (124M parameters) on 32-token sequences (bf16 is emulated on CPUs
    without AVX-512 BF16, ~10x slower than fp32: short sequences keep probes short)."""

    def config():
        from transformers import GPT2Config

        return GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, use_cache=False)

    return CausalLMWorkload("gpt2-seq32", config, seq_len=32, default_global_batch=4)


def gpt_tiny_4layer() -> CausalLMWorkload:
    """gpt-tiny with four blocks (1.3M parameters)."""

    def config():
        from transformers import GPT2Config

        return GPT2Config(
            n_layer=4,
            n_embd=128,
            n_head=4,
            n_positions=64,
            vocab_size=4096,
            bos_token_id=0,
            eos_token_id=0,
            use_cache=False,
        )

    return CausalLMWorkload("gpt-tiny-4layer", config, seq_len=64, default_global_batch=16)
