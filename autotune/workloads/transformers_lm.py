"""Language models built from `transformers` configs (random init, no download): causal LMs
trained on random token ids with their own LM loss, and masked LMs with BERT's masking."""

from __future__ import annotations

import copy
from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from autotune.workloads.base import Workload
from autotune.workloads.config_recipe import ConfigRecipe, recipe

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig

# Config attributes that name an MoE layer's expert count and its top-k.
_EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "top_k")


class CausalLMWorkload(Workload):
    """A `transformers` causal LM trained on random token ids with its own LM loss."""

    def __init__(
        self,
        name: str,
        make_config: ConfigRecipe | Callable[[], PretrainedConfig],
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
        return (type(self), self.name, self._make_config, self.seq_len, self._layers)

    def __eq__(self, other: object) -> bool:
        # Equal workloads share cached traces (the memory model builds variants by depth).
        return isinstance(other, CausalLMWorkload) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def config(self) -> PretrainedConfig:
        make = self._make_config
        config = make.build() if isinstance(make, ConfigRecipe) else make()
        if self._layers is not None:
            config.num_hidden_layers = self._layers
        return config

    def _recipe(self) -> ConfigRecipe | None:
        """The recipe with the layer override, or None for a config built by a function
        (a user's config file)."""
        make = self._make_config
        if not isinstance(make, ConfigRecipe):
            return None
        if self._layers is None:
            return make
        return make.with_keyword(make.layers_key, self._layers)

    @property
    def num_layers(self) -> int:
        recipe = self._recipe()
        return recipe.layers if recipe else int(self.config().num_hidden_layers)

    def with_layers(self, layers: int) -> CausalLMWorkload:
        """The same model with ``layers`` transformer blocks: the memory model traces two
        short stacks and extrapolates, since every block holds the same activations."""
        clone = copy.copy(self)
        clone._layers = layers
        return clone

    def _auto_class(self) -> Any:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM

    def import_model_code(self) -> None:
        from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

        MODEL_FOR_CAUSAL_LM_MAPPING[type(self.config())]  # imports the model's module

    def build_model(self) -> torch.nn.Module:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        config = self.config()
        kwargs: dict[str, Any] = {}
        if is_moe(config):
            # Grouped matmuls over tokens sorted by expert: the experts implementation of
            # transformers 5 for training, and one whose shapes do not depend on the routing
            # (the memory model traces it on fake tensors).
            kwargs["experts_implementation"] = "grouped_mm"
        try:
            # SDPA attention is what production uses on recent transformers; eager would
            # overstate activation memory.
            return self._auto_class().from_config(config, attn_implementation="sdpa", **kwargs)
        except (ValueError, TypeError):
            # a model without SDPA (or a transformers without experts implementations)
            return self._auto_class().from_config(config)

    def make_batch(self, micro_batch_size: int, device: torch.device) -> dict[str, Any]:
        import torch

        vocab_size = self.config().vocab_size
        generator = torch.Generator().manual_seed(micro_batch_size)
        input_ids = torch.randint(
            0, vocab_size, (micro_batch_size, self.seq_len), generator=generator
        ).to(device)
        return {"input_ids": input_ids, "labels": input_ids}

    def enable_activation_checkpointing(
        self, model: torch.nn.Module, blocks: int | None = None, policy: str = "full"
    ) -> None:
        # Non-reentrant checkpointing works with ZeRO-3's parameter hooks and frozen inputs
        # (checkpoint_options); the selective policy's context_fn reaches torch through
        # transformers' checkpoint kwargs. transformers 5 renamed
        # gradient_checkpointing_enable (kept as a deprecated alias).
        from autotune.workloads.checkpointing import checkpoint_options

        kwargs = checkpoint_options(policy)
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.config.use_cache = False
        if blocks is not None:
            # each layer's own switch (transformers' GradientCheckpointingLayer): the
            # first ``blocks`` keep it, the rest run as without checkpointing
            for layer in self.checkpoint_blocks(model)[blocks:]:
                layer.gradient_checkpointing = False

    def active_params(self, model: torch.nn.Module) -> int:
        """Parameters one token computes with: all of a dense model; of an MoE, the experts
        scaled by top-k / experts (each token runs through top-k of them)."""
        return active_params_of(model, self.config())

    def trace_fingerprint(self) -> dict[str, Any] | None:
        # A recipe's keywords name the model; the library versions in the trace cache's key
        # (transformers' among them) stand for the defaults of the keywords left out.
        recipe = self._recipe()
        if recipe is not None:
            config: dict[str, Any] = {"recipe": recipe.config_class, **recipe.keywords}
        else:
            config = self.config().to_dict()
        return {
            "class": f"{type(self).__module__}.{type(self).__qualname__}",
            "config": config,
            "seq_len": self.seq_len,
        }

    def describe(self) -> str:
        recipe = self._recipe()
        if recipe is not None:
            facts: Any = SimpleNamespace(**recipe.keywords)
            model_type, layers = recipe.model_type, recipe.layers
        else:
            facts = self.config()
            model_type, layers = facts.model_type, facts.num_hidden_layers
        kind = f"{model_type}"
        if is_moe(facts):
            top_k, experts = first_attr(facts, _TOP_K_KEYS), first_attr(facts, _EXPERT_COUNT_KEYS)
            kind += f" MoE, {top_k} of {experts} experts per token"
        return f"{self.name} ({kind}, {layers} layers, seq {self.seq_len})"


class MaskedLMWorkload(CausalLMWorkload):
    """A `transformers` masked LM (BERT-style): 15% of random tokens are prediction targets
    (Devlin et al. 2019, "BERT", sec. 3.1); the head scores every position either way."""

    def _auto_class(self) -> Any:
        from transformers import AutoModelForMaskedLM

        return AutoModelForMaskedLM

    def import_model_code(self) -> None:
        from transformers import MODEL_FOR_MASKED_LM_MAPPING

        MODEL_FOR_MASKED_LM_MAPPING[type(self.config())]  # imports the model's module

    def make_batch(self, micro_batch_size: int, device: torch.device) -> dict[str, Any]:
        import torch

        vocab_size = self.config().vocab_size
        generator = torch.Generator().manual_seed(micro_batch_size)
        shape = (micro_batch_size, self.seq_len)
        input_ids = torch.randint(0, vocab_size, shape, generator=generator)
        targets = torch.rand(shape, generator=generator) < 0.15
        labels = torch.where(targets, input_ids, torch.full_like(input_ids, -100))
        return {"input_ids": input_ids.to(device), "labels": labels.to(device)}


def first_attr(config: Any, keys: tuple[str, ...]) -> Any:
    """The first of ``keys`` the config sets (configs name the same thing differently)."""
    for key in keys:
        value = getattr(config, key, None)
        if value:
            return value
    return None


def is_moe(config: Any) -> bool:
    """Whether a config describes a mixture-of-experts model (more than one expert)."""
    count = first_attr(config, _EXPERT_COUNT_KEYS)
    return isinstance(count, int) and count > 1


def active_params_of(model: torch.nn.Module, config: Any) -> int:
    """Unique parameters, those under a module named ``experts`` (fused or one module per
    expert) counted at top-k / experts; shared experts and the router count in full."""
    unique = {id(p): (name, p) for name, p in model.named_parameters()}.values()
    total = 0.0
    share = 1.0
    if is_moe(config):
        top_k = first_attr(config, _TOP_K_KEYS) or 1
        share = min(1.0, top_k / first_attr(config, _EXPERT_COUNT_KEYS))
    for name, parameter in unique:
        routed = "experts" in name.split(".")[:-1]
        total += parameter.numel() * (share if routed else 1.0)
    return int(total)


def gpt2_like(
    name: str, *, layers: int, hidden: int, heads: int, seq_len: int, batch: int
) -> CausalLMWorkload:
    """A GPT-2 of the given dimensions (vocabulary 50257, 1024 positions, random init)."""

    config = recipe(
        "GPT2Config",
        "gpt2",
        "n_layer",
        n_layer=layers,
        n_embd=hidden,
        n_head=heads,
        n_positions=1024,
        use_cache=False,
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
    positions: int = 4096,
    rope_theta: float = 10000.0,
) -> CausalLMWorkload:
    config = recipe(
        "LlamaConfig",
        "llama",
        "num_hidden_layers",
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        max_position_embeddings=positions,
        rope_theta=rope_theta,
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


def llama3_8b() -> CausalLMWorkload:
    """Llama 3 8B dimensions (meta-llama/Meta-Llama-3-8B config: GQA with 8 key-value
    heads, vocabulary 128256, 8.0B parameters), sequence 2048."""
    return _llama(
        "llama3-8b",
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        intermediate=14336,
        vocab=128256,
        positions=8192,
        rope_theta=500000.0,
    )


def llama3_70b() -> CausalLMWorkload:
    """Llama 3 70B dimensions (meta-llama/Meta-Llama-3-70B config: GQA with 8 key-value
    heads, vocabulary 128256, 70.6B parameters), sequence 2048."""
    return _llama(
        "llama3-70b",
        layers=80,
        hidden=8192,
        heads=64,
        kv_heads=8,
        intermediate=28672,
        vocab=128256,
        positions=8192,
        rope_theta=500000.0,
    )


def mixtral_8x7b() -> CausalLMWorkload:
    """Mixtral 8x7B dimensions (mistralai/Mixtral-8x7B-v0.1 config: 8 experts, 2 per token,
    46.7B parameters of which 12.9B active), sequence 2048. For planning: a CPU probe of it
    would not finish."""

    config = recipe(
        "MixtralConfig",
        "mixtral",
        "num_hidden_layers",
        num_hidden_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        num_local_experts=8,
        num_experts_per_tok=2,
        vocab_size=32000,
        max_position_embeddings=32768,
        rope_theta=1e6,
        use_cache=False,
    )
    return CausalLMWorkload("mixtral-8x7b", config, seq_len=2048, default_global_batch=256)


def moe_tiny() -> CausalLMWorkload:
    """A ~1M-parameter Mixtral-style MoE (4 experts, 2 per token) for CPU tests."""

    config = recipe(
        "MixtralConfig",
        "mixtral",
        "num_hidden_layers",
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=4096,
        max_position_embeddings=64,
        use_cache=False,
    )
    return CausalLMWorkload("moe-tiny", config, seq_len=64, default_global_batch=16)


def gpt_tiny() -> CausalLMWorkload:
    """A ~0.9M-parameter GPT-2 whose fp32 CPU step is short enough for tests and demos."""

    config = recipe(
        "GPT2Config",
        "gpt2",
        "n_layer",
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
