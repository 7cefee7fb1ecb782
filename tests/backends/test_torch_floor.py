"""Each backend's torch floor: read from the installed version as numbers (2.10 is above
2.8), FSDP2's at 2.8, DeepSpeed's the floor pyproject.toml installs. The installed torch is
patched (a version string): no other torch can be installed beside this one."""

from __future__ import annotations

import re

import pytest

from autotune.backends import BACKENDS, _torch_floor, get_backend
from tests.support.paths import ROOT


@pytest.mark.parametrize(
    ("found", "dropped"),
    [
        ("2.6.0", True),
        ("2.7.1+cu126", True),
        ("2.8.0.dev20250601+cu128", False),
        ("2.10.0", False),
        ("2.13.0+cpu", False),
        (None, False),  # no torch metadata: torch's own import says what is wrong
    ],
)
def test_fsdp2_is_unavailable_below_torch_2_8(
    monkeypatch: pytest.MonkeyPatch, found: str | None, dropped: bool
) -> None:
    monkeypatch.setattr(_torch_floor, "installed_torch", lambda: found)
    problem = get_backend("fsdp2").unavailable(script=False)
    assert (problem is not None) == dropped, problem
    if dropped:
        assert "torch 2.8 or later" in problem and f"has torch {found};" in problem
        assert "pip install 'torch>=2.8'" in problem


def test_this_environment_is_above_every_floor_and_pyproject_installs_deepspeeds() -> None:
    assert _torch_floor.installed_torch() is not None
    for name in BACKENDS:
        assert get_backend(name).unavailable(script=False) is None, name
    floor = re.search(r'^\s*"torch>=(\d+)\.(\d+)', (ROOT / "pyproject.toml").read_text(), re.M)
    assert floor is not None, "pyproject.toml names no torch floor"
    assert (int(floor[1]), int(floor[2])) == get_backend("deepspeed").torch_floor


def test_a_script_study_cannot_use_fsdp2_whatever_the_torch() -> None:
    assert get_backend("fsdp2").unavailable(script=True) is not None
    assert get_backend("deepspeed").unavailable(script=True) is None
