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
        self.seq_len = seq_len
        self.tokens_per_sample = seq_len
        self.default_global_batch = default_global_batch

    def config(self) -> PretrainedConfig:
        return self._make_config()

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
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False

    def describe(self) -> str:
        cfg = self.config()
        return f"{self.name} ({cfg.model_type}, {cfg.num_hidden_layers} layers, seq {self.seq_len})"


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
