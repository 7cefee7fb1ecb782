"""The backend contract, run over every registered backend and a toy third one: what the
rest of autotune may ask a backend (:class:`~autotune.backends.TrainingBackend`), answered
with values of the right kind, so that a backend added by registration alone works where
the built-in ones do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Protocol

import pytest

from autotune.backends import (
    BACKEND_ROLES,
    BACKENDS,
    Breakdown,
    ModelFacts,
    TrainingBackend,
    get_backend,
)
from autotune.backends import register_backend as register
from autotune.backends.deepspeed import DeepSpeedBackend
from autotune.candidate import Candidate, FsdpKnobs

FACTS = ModelFacts(params=10_000_000, largest_param=1_000_000, small_params=20_000)
SHARED = {"precision": "bf16", "micro_batch_size": 2, "gradient_accumulation_steps": 2}
CANDIDATES = {
    "deepspeed": Candidate(zero_stage=3, data_parallel_size=2, **SHARED),
    "fsdp2": Candidate(
        backend="fsdp2", zero_stage=3, data_parallel_size=2, fsdp=FsdpKnobs(), **SHARED
    ),
}


class ToyBackend(DeepSpeedBackend):
    """A third backend, registered by a test: its own name and words, DeepSpeed's engine."""

    name = "toy"
    display_name = "Toy"
    cpu_ranks_library = "the toy engine"
    cpu_ranks_runtime = "the toy engine"
    config_file_name = "toy_config.json"


@pytest.fixture(params=["deepspeed", "fsdp2", "toy"])
def backend(request: pytest.FixtureRequest) -> Iterator[TrainingBackend]:
    if request.param == "toy":
        register("toy", ToyBackend)
    try:
        yield get_backend(request.param)
    finally:
        BACKENDS.pop("toy", None)


def _candidate(backend: TrainingBackend) -> Candidate:
    """A valid candidate of ``backend`` (the toy trains as DeepSpeed does)."""
    if backend.name == "toy":
        return CANDIDATES["deepspeed"].model_copy(update={"backend": "toy"})
    return CANDIDATES[backend.name]


def _members(protocol: type[Protocol]) -> set[str]:  # type: ignore[valid-type]
    """The members ``protocol`` declares itself (not its bases')."""
    declared = set(vars(protocol).get("__annotations__", {}))
    methods = {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
    return declared | methods


def _all_members() -> set[str]:
    return set().union(*(_members(role) for role in BACKEND_ROLES))


def test_every_member_is_in_one_role_and_the_backend_is_its_roles() -> None:
    """The roles split the interface: no member in two roles, and TrainingBackend declares
    none of its own beyond them."""
    seen: dict[str, str] = {}
    for role in BACKEND_ROLES:
        for member in _members(role):
            assert member not in seen, f"{member} in {seen.get(member)} and {role.__name__}"
            seen[member] = role.__name__
    assert _members(TrainingBackend) == set()
    assert set(BACKEND_ROLES) <= set(TrainingBackend.__mro__)
    assert len(seen) >= 30


def test_every_registered_backend_is_checked() -> None:
    assert set(BACKENDS) <= {"deepspeed", "fsdp2"}, "add the new backend's candidate here"


def test_a_backend_has_every_member_of_the_protocol(backend: TrainingBackend) -> None:
    missing = sorted(m for m in _all_members() if not hasattr(backend, m))
    assert missing == []


def test_a_backend_names_itself(backend: TrainingBackend) -> None:
    assert backend.name in BACKENDS
    for text in (
        backend.display_name,
        backend.cpu_ranks_library,
        backend.cpu_ranks_runtime,
        backend.engine_entry,
    ):
        assert isinstance(text, str) and text.strip()
    assert backend.config_file_name.endswith(".json")
    major, minor = backend.torch_floor
    assert isinstance(major, int) and isinstance(minor, int)
    assert isinstance(backend.shards_by_block, bool)


def test_a_backends_config_is_json_and_its_own_parser_takes_it(backend: TrainingBackend) -> None:
    candidate = _candidate(backend)
    config = backend.render_config(candidate, None)
    assert json.loads(json.dumps(config)) == config
    backend.validate_config(config, candidate.data_parallel_size, "cpu")
    assert not backend.uses_fallback_optimizer(config)
    fallback = backend.with_fallback_optimizer(config)  # the same where there is none
    backend.validate_config(fallback, candidate.data_parallel_size, "cpu")


def test_a_backends_memory_terms_are_bytes(backend: TrainingBackend) -> None:
    candidate = _candidate(backend)
    device, host = backend.model_states(candidate, FACTS)
    assert isinstance(device, Breakdown) and isinstance(host, Breakdown)
    assert device.total > 0 and host.total >= 0
    assert isinstance(backend.calibration_group(candidate), str)
    assert backend.calibration_group(candidate)
    assert isinstance(backend.holds_reduce_bucket(candidate), bool)


def test_a_backends_export_words_are_lines(backend: TrainingBackend) -> None:
    candidate = _candidate(backend)
    for lines in (
        backend.precision_actions(candidate),
        backend.setup_actions(candidate, {"scheduler": {"type": "WarmupLR"}}),
        backend.config_usage_lines(2, None),
    ):
        assert isinstance(lines, list) and all(isinstance(line, str) for line in lines)
    launch = backend.launch_script("autotune export", 2, "cpu", 1)
    assert launch.startswith("#!/usr/bin/env bash")
