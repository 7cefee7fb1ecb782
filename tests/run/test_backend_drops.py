"""A backend a study cannot train with leaves the plan's space with its reason, and the
study keeps that reason: every ``--script`` study drops FSDP2 from the default space
(whatever the script), and a torch below FSDP2's floor drops it from any study; a space
that lists only such a backend is refused in one line. The installed torch is patched
(a version string): no older torch can be installed beside this one."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.backends import _torch_floor
from tests.support.hardware import CPU
from tests.support.scripted import example_script_run

OLD_TORCH = "2.7.1+cu126"  # fully_shard public (2.6), reshard_after_forward=None not (2.8)
FLOOR_REASON = (
    "it needs torch 2.8 or later (fully_shard with reshard_after_forward=None for the root "
    "module) and this environment has torch 2.7.1+cu126; upgrade torch (pip install "
    "'torch>=2.8') to search it"
)


def _resolved_script_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    return example_script_run(
        tmp_path, monkeypatch, CPU, space="default", storage_url=f"sqlite:///{tmp_path}/autotune.db"
    )


def test_a_script_study_of_the_default_space_drops_fsdp2_and_the_study_keeps_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import optuna

    from autotune import events
    from autotune.backends.fsdp2._backend import SCRIPT_WITHOUT_FSDP2
    from autotune.run._driver_session import DriverSession
    from autotune.space import DroppedBackend, load_space
    from autotune.study import dropped_backends, load_existing_study
    from autotune.views import goal_lines, status_document

    assert load_space("default").backend == ["deepspeed", "fsdp2"]
    resolved = _resolved_script_run(tmp_path, monkeypatch)
    assert resolved.space.backends == ("deepspeed",)
    dropped = DroppedBackend(backend="fsdp2", reason=SCRIPT_WITHOUT_FSDP2)
    assert resolved.space.dropped_backends == (dropped,)
    assert dropped.line in resolved.notes
    with DriverSession(
        resolved,
        sampler=optuna.samplers.RandomSampler(seed=0),
        run_flags={},
        emit=events.ignore,
        on_beat=lambda: None,
    ):
        pass  # opening the study stores what the run's space dropped
    study = load_existing_study(resolved.settings.storage.storage_url, resolved.study_name)
    assert dropped_backends(study) == [dropped]
    assert f"backend fsdp2 dropped: {SCRIPT_WITHOUT_FSDP2}" in goal_lines(study)
    assert status_document(study)["dropped_backends"] == [
        {"backend": "fsdp2", "reason": SCRIPT_WITHOUT_FSDP2}
    ]


def test_below_fsdp2s_torch_floor_the_default_space_drops_it_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.backends import get_backend
    from autotune.run import bind_space
    from autotune.space import DroppedBackend, load_space

    def bound() -> object:
        spec = load_space("default")
        return bind_space(
            spec, CPU, ranks=2, global_batch=16, max_global_batch=None, nvme_path=None
        )

    assert bound().backends == ("deepspeed", "fsdp2")  # this environment's torch: both
    monkeypatch.setattr(_torch_floor, "installed_torch", lambda: OLD_TORCH)
    assert get_backend("deepspeed").unavailable(script=False) is None  # its floor is 2.5
    below = bound()
    assert below.backends == ("deepspeed",)
    assert below.dropped_backends == (DroppedBackend(backend="fsdp2", reason=FLOOR_REASON),)
    assert not any(c.backend == "fsdp2" for c in below.candidates())
    assert f"backend fsdp2 dropped: {FLOOR_REASON}" in below.notes


def test_a_space_of_fsdp2_only_below_its_floor_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from autotune.cli._app import main
    from autotune.errors import SpaceError
    from autotune.run import resolve_run
    from autotune.settings import RunSettings

    monkeypatch.chdir(tmp_path)
    Path("fsdp2.yaml").write_text("backend: [fsdp2]\nmicro_batch_size: [4]\n")
    monkeypatch.setattr(_torch_floor, "installed_torch", lambda: OLD_TORCH)
    refusal = (
        "space lists backend [fsdp2] only, and this study cannot train with fsdp2: "
        f"{FLOOR_REASON}; add deepspeed to 'backend'"
    )
    settings = RunSettings.build(workload="gpt-tiny", world_sizes=(2,), space="fsdp2.yaml")
    with pytest.raises(SpaceError) as refused:
        resolve_run(settings, CPU)  # what `autotune run` plans first
    assert str(refused.value) == refusal
    assert not list(tmp_path.glob("trials*")), "nothing is written for a refused space"
    code = main(["space", "--space", "fsdp2.yaml", "--gpus", "2"])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert err.splitlines() == [f"autotune: error: {refusal}"]
