"""Causal language models built from `transformers` configs (random init, no download)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autotune.workloads.base import Workload

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig


class CausalLMWorkload(Workload):
    """A `transformers` causal LM trained on random token ids with its own LM loss."""

    def __init__(
        self,
        name: str,
        make_config: Callable[[], PretrainedConfig],
        *,
        seq_len: int,
        default_global_batch: int,
    ) -> None:
        self.name = name
        self._make_config = make_config
        self._layers: int | None = None
        self.seq_len = seq_len
        self.tokens_per_sample = seq_len
        self.default_global_batch = default_global_batch

    def _identity(self) -> tuple[object, ...]:
        return (self.name, self._make_config, self.seq_len, self._layers)

    def __eq__(self, other: object) -> bool:
        # Equal workloads share cached traces (the memory model builds variants by depth).
        return isinstance(other, CausalLMWorkload) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def config(self) -> PretrainedConfig:
        config = self._make_config()
        if self._layers is not None:
            config.num_hidden_layers = self._layers
        return config

    @property
    def num_layers(self) -> int:
        return int(self.config().num_hidden_layers)

    def with_layers(self, layers: int) -> CausalLMWorkload:
        """The same model with ``layers`` transformer blocks: the memory model traces two
        short stacks and extrapolates, since every block holds the same activations."""
        clone = CausalLMWorkload(
            self.name,
            self._make_config,
            seq_len=self.seq_len,
            default_global_batch=self.default_global_batch,
        )
        clone._layers = layers
        return clone

    def build_model(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        # SDPA attention is what production uses on recent transformers; eager would
        # overstate activation memory.
        return AutoModelForCausalLM.from_config(self.config(), attn_implementation="sdpa")

    def make_batch(self, micro_batch_size: int, device: torch.device) -> dict[str, Any]:
        import torch

        vocab_size = self.config().vocab_size
        generator = torch.Generator().manual_seed(micro_batch_size)
        input_ids = torch.randint(
            0, vocab_size, (micro_batch_size, self.seq_len), generator=generator
        ).to(device)
        return {"input_ids": input_ids, "labels": input_ids}

    def enable_activation_checkpointing(self, model: torch.nn.Module) -> None:
        # Non-reentrant checkpointing works with ZeRO-3's parameter hooks and frozen inputs.
        # transformers 5 renamed gradient_checkpointing_enable (kept as a deprecated alias).
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.config.use_cache = False

    def describe(self) -> str:
        cfg = self.config()
        return f"{self.name} ({cfg.model_type}, {cfg.num_hidden_layers} layers, seq {self.seq_len})"


def gpt2_like(
    name: str, *, layers: int, hidden: int, heads: int, seq_len: int, batch: int
) -> CausalLMWorkload:
    """A GPT-2 of the given dimensions (vocabulary 50257, 1024 positions, random init)."""

    def config() -> PretrainedConfig:
        from transformers import GPT2Config

        return GPT2Config(
            n_layer=layers, n_embd=hidden, n_head=heads, n_positions=1024, use_cache=False
        )

    return CausalLMWorkload(name, config, seq_len=seq_len, default_global_batch=batch)


def gpt2() -> CausalLMWorkload:
    """GPT-2 small (124M), sequence 1024."""
    return gpt2_like("gpt2", layers=12, hidden=768, heads=12, seq_len=1024, batch=512)


def gpt2_xl() -> CausalLMWorkload:
    """GPT-2 XL (1.5B), sequence 1024."""
    return gpt2_like("gpt2-xl", layers=48, hidden=1600, heads=25, seq_len=1024, batch=512)


def _llama(
    name: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    tied: bool = False,
) -> CausalLMWorkload:
    def config() -> PretrainedConfig:
        from transformers import LlamaConfig

        return LlamaConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            intermediate_size=intermediate,
            vocab_size=vocab,
            max_position_embeddings=4096,
            tie_word_embeddings=tied,
            use_cache=False,
        )

    return CausalLMWorkload(name, config, seq_len=2048, default_global_batch=256)


def llama_1b() -> CausalLMWorkload:
    """Llama 3.2 1B dimensions (1.2B parameters, tied embeddings), sequence 2048."""
    return _llama(
        "llama-1b",
        layers=16,
        hidden=2048,
        heads=32,
        kv_heads=8,
        intermediate=8192,
        vocab=128256,
        tied=True,
    )


def llama_7b() -> CausalLMWorkload:
    """Llama 2 7B dimensions, sequence 2048."""
    return _llama(
        "llama-7b", layers=32, hidden=4096, heads=32, kv_heads=32, intermediate=11008, vocab=32000
    )


def llama_13b() -> CausalLMWorkload:
    """Llama 2 13B dimensions, sequence 2048."""
    return _llama(
        "llama-13b", layers=40, hidden=5120, heads=40, kv_heads=40, intermediate=13824, vocab=32000
    )


def llama_70b() -> CausalLMWorkload:
    """Llama 2 70B dimensions (grouped-query attention), sequence 2048."""
    return _llama(
        "llama-70b", layers=80, hidden=8192, heads=64, kv_heads=8, intermediate=28672, vocab=32000
    )


def gpt_tiny() -> CausalLMWorkload:
    """A ~0.9M-parameter GPT-2 whose fp32 CPU step takes about a tenth of a second."""

    def config() -> PretrainedConfig:
        from transformers import GPT2Config

        return GPT2Config(
            n_layer=2,
            n_embd=128,
            n_head=4,
            n_positions=64,
            vocab_size=4096,
            bos_token_id=0,
            eos_token_id=0,
            use_cache=False,
        )

    return CausalLMWorkload("gpt-tiny", config, seq_len=64, default_global_batch=16)
