"""Built-in language models are config recipes: what the driver says of them, and the key
their traces are cached under, come without importing transformers, and agree with the
config transformers builds from the recipe."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autotune.memory._trace_cache import cache_key
from autotune.workloads import WORKLOADS, get_workload
from autotune.workloads.config_recipe import ConfigRecipe
from autotune.workloads.transformers_lm import CausalLMWorkload

RECIPES = [
    name
    for name in WORKLOADS
    if isinstance(getattr(get_workload(name), "_make_config", None), ConfigRecipe)
]


def test_the_transformers_models_are_recipes() -> None:
    assert {"gpt-tiny", "gpt2", "llama3-8b", "mixtral-8x7b", "moe-tiny"} <= set(RECIPES)


@pytest.mark.parametrize("name", RECIPES)
def test_a_recipe_says_what_its_built_config_says(name: str) -> None:
    workload = get_workload(name)
    built = workload.config()
    made = workload._make_config
    from_config = CausalLMWorkload(
        workload.name,
        made.build,
        seq_len=workload.seq_len,
        default_global_batch=workload.default_global_batch,
    )
    assert built.model_type == made.model_type
    assert workload.describe() == from_config.describe()
    assert workload.num_layers == built.num_hidden_layers == from_config.num_layers
    shallow = workload.with_layers(1)
    assert shallow.num_layers == shallow.config().num_hidden_layers == 1
    assert shallow.describe() == from_config.with_layers(1).describe()


def test_the_cache_key_follows_the_recipe_and_the_depth() -> None:
    workload = get_workload("gpt-tiny")
    assert cache_key(workload) == cache_key(get_workload("gpt-tiny"))
    assert cache_key(workload.with_layers(1)) != cache_key(workload)
    wider = CausalLMWorkload(
        "gpt-tiny",
        ConfigRecipe(**{**vars(workload._make_config), "kwargs": (("n_embd", 256),)}),
        seq_len=workload.seq_len,
        default_global_batch=workload.default_global_batch,
    )
    assert cache_key(wider) != cache_key(workload)


def test_what_the_driver_asks_of_a_built_in_model_imports_no_transformers() -> None:
    code = (
        "import sys\n"
        "from autotune.memory._trace_cache import cache_key\n"
        "from autotune.workloads import get_workload\n"
        "for name in ('gpt-tiny', 'llama3-8b', 'moe-tiny'):\n"
        "    w = get_workload(name)\n"
        "    w.describe(), w.num_layers, cache_key(w), cache_key(w.with_layers(1))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
