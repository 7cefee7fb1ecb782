"""Activation profiles kept on disk between runs: real fake-tensor traces of gpt-tiny."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune import activations, trace_cache
from autotune.workloads import get_workload


def _forget_in_process() -> None:
    activations._profile.cache_clear()
    activations._fake_model.cache_clear()


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

    class Unnamed(type(workload)):  # type: ignore[misc]
        def trace_fingerprint(self) -> None:
            return None

    unnamed = Unnamed.__new__(Unnamed)
    unnamed.__dict__.update(vars(workload))
    assert trace_cache.cache_key(unnamed) is None


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
    name = trace_cache.entry_name(1, "fp32", False, "kept")
    assert trace_cache.load(key)[name] == profile.model_dump()
    _forget_in_process()
