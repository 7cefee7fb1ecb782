"""Resolving a run's checkpointing: the space's shares of the blocks counted on the
workload's blocks, and what a workload or a script cannot do dropped with one note."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.hardware import Hardware
from tests.support.hardware import CPU
from tests.support.scripted import example_script_run

SPACE = "precision: [fp32]\nzero_stage: [0]\nmicro_batch_size: [4]\n"


def _resolve(tmp_path: Path, workload: str, space: str, hardware: Hardware | None = None):
    from autotune.run._resolved_run import resolve_run
    from autotune.settings import RunSettings

    (tmp_path / "space.yaml").write_text(SPACE + space)
    return resolve_run(
        RunSettings.build(
            workload=workload,
            world_sizes=(2,),
            global_batch=8,
            space=str(tmp_path / "space.yaml"),
            trials_dir=tmp_path / "trials",
        ),
        hardware,
    )


def test_a_built_in_model_counts_the_shares_in_its_blocks(tmp_path: Path) -> None:
    resolved = _resolve(tmp_path, "gpt2", "checkpoint_fraction: [0, 0.25, 0.27, 1]\n")
    assert [c.checkpoint_fraction for c in resolved.space.candidates()] == [0.0, 0.25, 1.0]
    assert any("0.25, 0.27 recompute the same 3 of 12 blocks" in n for n in resolved.notes)
    assert resolved.config.space["checkpoint_fraction"] == [0.0, 0.25, 0.27, 1.0]


def test_a_workload_that_recomputes_all_or_none_keeps_those(tmp_path: Path) -> None:
    (tmp_path / "wl.py").write_text(
        "from autotune.workloads import get_workload\n"
        "class AllOrNothing(type(get_workload('gpt-tiny'))):\n"
        "    def enable_activation_checkpointing(self, model):\n"
        "        super().enable_activation_checkpointing(model)\n"
        "def make():\n"
        "    workload = get_workload('gpt-tiny')\n"
        "    workload.__class__ = AllOrNothing\n"
        "    return workload\n"
    )
    resolved = _resolve(tmp_path, f"{tmp_path}/wl.py:make", "checkpoint_fraction: [0, 0.5, 1]\n")
    assert {c.checkpoint_fraction for c in resolved.space.candidates()} == {0.0, 1.0}
    assert any(
        "checkpoint_fraction 0.5 dropped" in n and "takes no blocks" in n for n in resolved.notes
    )


@pytest.mark.parametrize(
    ("mappings", "kept", "note"),
    [
        ([], {0.0}, "no flag for a share of its blocks to recompute"),
        (["activation_checkpointing=--ckpt"], {0.0, 1.0}, "checkpoint_fraction 0.5 dropped"),
        (["checkpoint_fraction=--ckpt-share"], {0.0, 0.5, 1.0}, None),
    ],
)
def test_a_script_searches_what_its_flags_carry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mappings, kept, note
) -> None:
    (tmp_path / "space.yaml").write_text(SPACE + "checkpoint_fraction: [0, 0.5, 1]\n")
    resolved = example_script_run(
        tmp_path, monkeypatch, mappings=tuple(mappings), space=str(tmp_path / "space.yaml")
    )
    script = resolved.config.script
    assert {c.checkpoint_fraction for c in resolved.space.candidates()} == kept
    if note is None:
        assert not any("checkpoint" in n for n in resolved.notes), resolved.notes
        half = next(c for c in resolved.space.candidates() if c.checkpoint_fraction == 0.5)
        assert script.argv(half, "c.json")[-2:] == ["--ckpt-share", "0.5"]
    else:
        assert any(note in n for n in resolved.notes), resolved.notes


def test_the_selective_policy_needs_a_workload_that_takes_it(tmp_path: Path) -> None:
    space = "checkpoint_fraction: [0, 1]\ncheckpoint_policy: [full, selective]\n"
    resolved = _resolve(tmp_path, "gpt-tiny", space)
    assert {c.checkpoint_policy for c in resolved.space.candidates()} == {"full", "selective"}
    (tmp_path / "wl.py").write_text(
        "from autotune.workloads import get_workload\n"
        "class InFull(type(get_workload('gpt-tiny'))):\n"
        "    def enable_activation_checkpointing(self, model, blocks=None):\n"
        "        super().enable_activation_checkpointing(model, blocks)\n"
        "def make():\n"
        "    workload = get_workload('gpt-tiny')\n"
        "    workload.__class__ = InFull\n"
        "    return workload\n"
    )
    resolved = _resolve(tmp_path, f"{tmp_path}/wl.py:make", space)
    assert {c.checkpoint_policy for c in resolved.space.candidates()} == {"full"}
    assert any("checkpoint_policy selective dropped" in n for n in resolved.notes)


def test_a_script_recomputes_as_its_code_says(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "space.yaml").write_text(
        SPACE + "activation_checkpointing: [false, true]\ncheckpoint_policy: [selective]\n"
    )
    resolved = example_script_run(
        tmp_path,
        monkeypatch,
        mappings=("activation_checkpointing=--ckpt",),
        space=str(tmp_path / "space.yaml"),
    )
    assert {c.checkpoint_policy for c in resolved.space.candidates()} == {"full"}
    assert any("checkpoint_policy selective dropped" in n for n in resolved.notes)


_OFFLOAD = "checkpoint_fraction: [0, 0.5]\nactivation_offload: [none, cpu]\n"


def _cuda() -> Hardware:
    return CPU.model_copy(
        update={"accelerator": "cuda", "device_name": "test GPU", "device_memory_bytes": 80 << 30}
    )


def test_activation_offload_is_dropped_on_cpu_ranks_and_kept_on_gpus(tmp_path: Path) -> None:
    on_cpu = _resolve(tmp_path, "gpt-tiny", _OFFLOAD, CPU)
    assert {c.activation_offload for c in on_cpu.space.candidates()} == {"none"}
    dropped = [n for n in on_cpu.notes if "activation_offload" in n]
    assert len(dropped) == 1 and "CPU ranks" in dropped[0] and "one memory" in dropped[0]
    assert on_cpu.config.space["activation_offload"] == ["none"]
    on_gpus = _resolve(tmp_path, "gpt-tiny", _OFFLOAD, _cuda())
    assert {c.activation_offload for c in on_gpus.space.candidates()} == {"none", "cpu"}
    assert not any("activation_offload" in n for n in on_gpus.notes), on_gpus.notes
    assert on_gpus.config.space["activation_offload"] == ["none", "cpu"]


def test_activation_offload_needs_blocks(tmp_path: Path) -> None:
    (tmp_path / "wl.py").write_text(
        "from autotune.workloads import get_workload\n"
        "class Blockless(type(get_workload('gpt-tiny'))):\n"
        "    def checkpoint_blocks(self, model):\n"
        "        return []\n"
        "def make():\n"
        "    workload = get_workload('gpt-tiny')\n"
        "    workload.__class__ = Blockless\n"
        "    return workload\n"
    )
    resolved = _resolve(
        tmp_path, f"{tmp_path}/wl.py:make", "activation_offload: [none, cpu]\n", _cuda()
    )
    assert {c.activation_offload for c in resolved.space.candidates()} == {"none"}
    assert any("activation_offload cpu dropped" in n and "no blocks" in n for n in resolved.notes)


def test_a_script_keeps_its_activations_where_its_code_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "space.yaml").write_text(SPACE + "activation_offload: [none, cpu]\n")
    resolved = example_script_run(
        tmp_path, monkeypatch, hardware=_cuda(), space=str(tmp_path / "space.yaml")
    )
    assert {c.activation_offload for c in resolved.space.candidates()} == {"none"}
    dropped = [n for n in resolved.notes if "activation_offload" in n]
    assert len(dropped) == 1 and "runs its own model" in dropped[0]


def test_autotune_space_counts_what_the_run_searches(tmp_path: Path, monkeypatch, capsys) -> None:
    """`autotune space` drops what `autotune run` drops here, with the run's note."""
    from autotune.cli import main

    resolved = _resolve(tmp_path, "gpt-tiny", "activation_offload: [none, cpu]\n")
    monkeypatch.chdir(tmp_path)
    code = main(["space", "--space", "space.yaml", "--gpus", "2", "--global-batch", "8"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    note = next(n for n in resolved.notes if n.startswith("activation_offload cpu dropped"))
    assert f"note: {note}" in " ".join(out.split())
    assert "act:cpu" not in out


@pytest.mark.parametrize(
    "space", ["activation_offload: [none, cpu]\n", "checkpoint_fraction: [0, 0.5]\n"]
)
def test_a_model_that_does_not_build_says_so_in_one_line(tmp_path: Path, space: str) -> None:
    """The drops build the model to count its blocks: a build that fails is the user's
    one-line error there too, not a traceback."""
    from autotune.errors import WorkloadError

    (tmp_path / "wl.py").write_text(
        "from autotune.workloads import get_workload\n"
        "class Broken(type(get_workload('gpt-tiny'))):\n"
        "    def build_model(self):\n"
        "        raise RuntimeError('no such layer: attn2')\n"
        "def make():\n"
        "    workload = get_workload('gpt-tiny')\n"
        "    workload.__class__ = Broken\n"
        "    return workload\n"
    )
    with pytest.raises(WorkloadError, match=r"build_model\(\) failed on the meta device"):
        _resolve(tmp_path, f"{tmp_path}/wl.py:make", space, _cuda())
