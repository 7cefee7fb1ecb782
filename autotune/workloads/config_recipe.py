"""A `transformers` config named by its class and keywords, built only where a model is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PretrainedConfig


@dataclass(frozen=True)
class ConfigRecipe:
    """A `transformers` config by its class's name and keywords: what a built-in model's
    driver needs (its study fingerprint, its description) without importing transformers,
    whose import would cost every ``autotune`` process CPU beyond torch's."""

    config_class: str = field(metadata={"doc": "transformers' config class, e.g. GPT2Config"})
    model_type: str = field(metadata={"doc": "that class's model_type, e.g. gpt2"})
    layers_key: str = field(metadata={"doc": "the keyword that sets the number of blocks"})
    kwargs: tuple[tuple[str, Any], ...] = field(metadata={"doc": "the config's keywords"})

    @property
    def keywords(self) -> dict[str, Any]:
        return dict(self.kwargs)

    @property
    def layers(self) -> int:
        return int(self.keywords[self.layers_key])

    def with_keyword(self, name: str, value: Any) -> ConfigRecipe:
        kwargs = tuple(sorted({**self.keywords, name: value}.items()))
        return ConfigRecipe(self.config_class, self.model_type, self.layers_key, kwargs)

    def build(self) -> PretrainedConfig:
        import transformers

        return getattr(transformers, self.config_class)(**dict(self.kwargs))


def recipe(config_class: str, model_type: str, layers_key: str, **kwargs: Any) -> ConfigRecipe:
    """A recipe of ``config_class(**kwargs)`` (its keywords in a fixed order)."""
    return ConfigRecipe(config_class, model_type, layers_key, tuple(sorted(kwargs.items())))
