"""The training-backend seam: the registry names DeepSpeed, refuses an unknown name with the
valid ones, and picks up a second backend by registration alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from autotune.backends import BACKENDS, DEFAULT_BACKEND, TrainingBackend, get_backend
from autotune.backends import register_backend as register
from autotune.backends.deepspeed import DeepSpeedBackend
from autotune.candidate import Candidate

CANDIDATE = Candidate(
    precision="bf16",
    zero_stage=2,
    micro_batch_size=2,
    gradient_accumulation_steps=1,
    data_parallel_size=2,
)


class ToyBackend(DeepSpeedBackend):
    """A second backend: its own name, config file and rendering."""

    name = "toy"
    config_file_name = "toy.json"

    def render_config(self, candidate: Candidate, base=None, **_: object) -> dict:  # type: ignore[override]
        return {"batch": candidate.micro_batch_size}


@pytest.fixture
def toy() -> Iterator[None]:
    register("toy", ToyBackend)
    yield
    BACKENDS.pop("toy")


def test_the_default_backend_is_deepspeed() -> None:
    backend = get_backend(DEFAULT_BACKEND)
    assert DEFAULT_BACKEND == "deepspeed"
    assert isinstance(backend, DeepSpeedBackend)
    assert backend.name == "deepspeed" and backend.config_file_name == "ds_config.json"
    assert get_backend("deepspeed") is backend  # made once
    config = backend.render_config(CANDIDATE)
    assert config["zero_optimization"]["stage"] == 2 and config["bf16"] == {"enabled": True}


def test_an_unknown_backend_is_one_error_listing_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"backend 'fsdp'; valid: deepspeed, fsdp2"):
        get_backend("fsdp")


def test_a_registered_backend_is_picked_up(toy: None) -> None:
    backend: TrainingBackend = get_backend("toy")
    assert backend.name == "toy"
    assert backend.render_config(CANDIDATE) == {"batch": 2}
    with pytest.raises(ValueError, match="valid: deepspeed, fsdp2, toy"):
        get_backend("nope")
