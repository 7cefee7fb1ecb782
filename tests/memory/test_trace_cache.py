"""Activation profiles and parameter counts kept on disk between runs: real fake-tensor
traces and meta-device builds of gpt-tiny."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.memory import _trace_cache as trace_cache
from autotune.memory import activations
from autotune.memory import memory_model as memory
from autotune.workloads import get_workload


def _forget_in_process() -> None:
    activations._profile.cache_clear()
    activations._fake_model.cache_clear()
    memory.model_facts.cache_clear()
    trace_cache._read.clear()


def _without_fingerprint(workload: object) -> object:
    """The same workload as a user's factory would give it: one that names no model."""

    class Unnamed(type(workload)):  # type: ignore[misc]
        def trace_fingerprint(self) -> None:
            return None

    unnamed = Unnamed.__new__(Unnamed)
    unnamed.__dict__.update(vars(workload))
    return unnamed


def test_a_later_process_reads_the_profile_instead_of_tracing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    workload = get_workload("gpt-tiny")
    _forget_in_process()
    traced = activations.profile(workload, 2, "bf16", False, "dropped")
    assert traced.backward_peak_bytes > 0
    files = list((tmp_path / "autotune" / "activations").glob("*.json"))
    assert len(files) == 1

    _forget_in_process()  # as a new process would start

    def no_trace(*args: object) -> None:
        raise AssertionError("traced again")

    monkeypatch.setattr(activations, "_traced", no_trace)
    assert activations.profile(workload, 2, "bf16", False, "dropped") == traced
    assert activations.profile(workload, 2, "fp16", False, "dropped") == traced  # same sizes
    with pytest.raises(AssertionError, match="traced again"):
        activations.profile(workload, 4, "bf16", False, "dropped")  # not kept yet
    _forget_in_process()


def test_the_key_follows_the_model_and_a_workload_without_fingerprint_has_none() -> None:
    workload = get_workload("gpt-tiny")
    key = trace_cache.cache_key(workload)
    assert key is not None and key == trace_cache.cache_key(get_workload("gpt-tiny"))
    assert trace_cache.cache_key(workload.with_layers(1)) != key
    assert trace_cache.cache_key(get_workload("dit-s-8")) not in (None, key)
    unnamed = _without_fingerprint(workload)
    assert trace_cache.cache_key(unnamed) is None


def test_the_key_follows_the_code_that_routes_cuda_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    workload = get_workload("gpt-tiny")
    key = trace_cache.cache_key(workload)
    digest = trace_cache._source_digest

    def changed(name: str) -> str:
        return "changed" if name == "autotune.memory._cuda_kernels" else digest(name)

    monkeypatch.setattr(trace_cache, "_source_digest", changed)
    assert trace_cache.cache_key(workload) != key


def test_cpu_and_cuda_traces_are_kept_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace of the CPU's kernels is never read for CUDA ranks, nor the other way."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    workload = get_workload("gpt-tiny")
    _forget_in_process()
    cpu = activations.profile(workload, 2, "fp32", False, "kept", "cpu")
    _forget_in_process()  # as a new process would start: only the CPU trace is on disk
    traced: list[object] = []
    trace = activations._traced
    monkeypatch.setattr(activations, "_traced", lambda *args: traced.append(args) or trace(*args))
    cuda = activations.profile(workload, 2, "fp32", False, "kept", "cuda")
    assert traced and cuda.forward_peak_bytes < cpu.forward_peak_bytes

    _forget_in_process()

    def no_trace(*args: object) -> None:
        raise AssertionError("traced again")

    monkeypatch.setattr(activations, "_traced", no_trace)
    assert activations.profile(workload, 2, "fp32", False, "kept", "cpu") == cpu
    assert activations.profile(workload, 2, "fp32", False, "kept", "cuda") == cuda
    _forget_in_process()


def test_a_damaged_file_is_traced_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    workload = get_workload("gpt-tiny")
    key = trace_cache.cache_key(workload)
    assert key is not None
    path = tmp_path / "autotune" / "activations" / f"{key}.json"
    path.parent.mkdir(parents=True)
    path.write_text("{broken")
    _forget_in_process()
    profile = activations.profile(workload, 1, "fp32", False, "kept")
    assert profile.forward_peak_bytes > 0
    name = trace_cache.entry_name(1, "fp32", False, "kept", "cpu")
    assert trace_cache.load(key)[name] == profile.model_dump()
    _forget_in_process()


def test_a_later_process_reads_the_parameter_counts_instead_of_building_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    workload = get_workload("gpt-tiny")
    _forget_in_process()
    built = memory.model_facts(workload, 1000)
    assert built.params > built.largest_param > 0 and 0 < built.small_params < built.params

    _forget_in_process()  # as a new process would start

    def no_build(*args: object) -> None:
        raise AssertionError("built again")

    monkeypatch.setattr(memory, "_counted", no_build)
    assert memory.model_facts(workload, 1000) == built
    with pytest.raises(AssertionError, match="built again"):
        memory.model_facts(workload, 0)  # another persistence threshold: not kept yet
    with pytest.raises(AssertionError, match="built again"):
        memory.model_facts(workload.with_layers(1), 1000)  # another model
    _forget_in_process()


def test_a_user_factory_without_fingerprint_is_built_in_every_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    workload = get_workload("gpt-tiny")
    unnamed = _without_fingerprint(workload)
    _forget_in_process()
    assert memory.model_facts(unnamed, 0).params > 0
    assert not (tmp_path / "autotune").exists()  # nothing kept
    _forget_in_process()
