"""The backend dimension of a space: FSDP2's decisions beside DeepSpeed's, what binding
drops for FSDP2 (fp16, reshard sizes that do not divide the ranks), a backend the study
cannot use dropped with its reason, and
the space file's errors for its keys."""

from __future__ import annotations

import optuna
import pytest

from autotune.errors import SpaceError
from autotune.space import DroppedBackend, parse_space
from tests.support.hardware import CPU

AMPERE = CPU.model_copy(
    update={"accelerator": "cuda", "device_name": "A100", "precisions": ("fp32", "bf16", "fp16")}
)
BOTH = """
backend: [deepspeed, fsdp2]
precision: [bf16, fp16]
zero_stage: [0, 3]
micro_batch_size: [4, 8]
fsdp:
  reshard_after_forward: [true, false, 2, 3]
  cpu_offload: [false, true]
  wrap: [block, model]
"""


def test_both_backends_are_searched_with_fsdp2_decisions_of_their_own() -> None:
    bound = parse_space(BOTH).bind(AMPERE, data_parallel_size=4, global_batch=32)
    assert bound.backends == ("deepspeed", "fsdp2")
    assert "fp16 dropped for fsdp2: it needs a gradient scaler; bf16 does not" in bound.notes
    assert any("reshard_after_forward 3 dropped" in note for note in bound.notes)
    candidates = list(bound.candidates())
    fsdp2 = [c for c in candidates if c.backend == "fsdp2"]
    deepspeed = [c for c in candidates if c.backend == "deepspeed"]
    assert len(deepspeed) == 2 * 2 * 2  # precision x stage x micro-batch
    # per block: 3 reshard choices; one unit: its root never reshards; mb4 accumulates 2
    # micro-batches, reduced on the last or after each; mb8 accumulates none
    assert len(fsdp2) == (2 + 1) * (2 * 3 + 2 * 1)  # sync x (offload x wrap/reshard)
    synced = {c.fsdp.sync_each_micro_batch for c in fsdp2 if c.gradient_accumulation_steps == 2}
    assert synced == {False, True}
    assert not any(c.fsdp.sync_each_micro_batch for c in fsdp2 if c.micro_batch_size == 8)
    assert {c.precision for c in fsdp2} == {"bf16"}
    assert {c.fsdp.reshard_after_forward for c in fsdp2 if c.fsdp.wrap == "model"} == {False}
    assert {c.fsdp.reshard_after_forward for c in fsdp2} == {True, False, 2}
    assert all(c.zero_stage == 3 for c in fsdp2)
    assert bound.dimensions()["backend"] == {"deepspeed": 8, "fsdp2": 24}
    assert bound.dimensions()["fsdp.sync_each_micro_batch"] == {"False": 16, "True": 8}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(30):  # Optuna's suggestions stay valid and map back to their params
        trial = study.ask()
        candidate = bound.suggest(trial)
        assert bound.params_of(candidate) == trial.params
        assert candidate in candidates
        study.tell(trial, 1.0)


def test_an_unavailable_backend_is_dropped_with_its_reason_kept() -> None:
    reason = "a --script study probes the DeepSpeed engine its script builds"
    spec = parse_space(BOTH)
    unavailable = {"fsdp2": reason}
    bound = spec.bind(CPU, data_parallel_size=2, global_batch=16, unavailable_backends=unavailable)
    assert bound.backends == ("deepspeed",)
    assert bound.dropped_backends == (DroppedBackend(backend="fsdp2", reason=reason),)
    assert f"backend fsdp2 dropped: {reason}" in bound.notes
    assert not spec.bind(CPU, data_parallel_size=2, global_batch=16).dropped_backends
    only = parse_space("backend: [fsdp2]\nmicro_batch_size: [4]\n")
    with pytest.raises(SpaceError) as refused:
        only.bind(CPU, data_parallel_size=2, global_batch=16, unavailable_backends=unavailable)
    assert str(refused.value) == (
        f"space lists backend [fsdp2] only, and this study cannot train with fsdp2: {reason}; "
        "add deepspeed to 'backend'"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("backend: [megatron]\nmicro_batch_size: [4]\n", "backend"),
        ("micro_batch_size: [4]\nfsdp:\n  reshard: [true]\n", "unknown key 'reshard'"),
        ("micro_batch_size: [4]\nfsdp:\n  wrap: [block, block]\n", "lists a value twice"),
    ],
)
def test_fsdp_keys_are_checked_with_their_line(text: str, message: str) -> None:
    with pytest.raises(SpaceError, match=message):
        parse_space(text, source="space.yaml")


def test_fsdp2_alone_with_fp16_only_is_refused() -> None:
    spec = parse_space("backend: [fsdp2]\nprecision: [fp16]\nmicro_batch_size: [4]\n")
    with pytest.raises(SpaceError, match="fsdp2 lists no precision"):
        spec.bind(AMPERE, data_parallel_size=2, global_batch=16)


def test_a_deepspeed_only_space_is_stored_as_before_fsdp2() -> None:
    """Studies stored before FSDP2 (and before the checkpoint fraction) hold spaces without
    its keys: a run that continues one with a DeepSpeed-only space compares equal, one that
    adds fsdp2 does not."""
    before = parse_space("micro_batch_size: [4]\n").model_dump(mode="json")
    del before["backend"], before["fsdp"], before["checkpoint_fraction"]
    del before["checkpoint_policy"], before["activation_offload"]
    assert parse_space("micro_batch_size: [4]\n").stored() == before
    both = parse_space("backend: [deepspeed, fsdp2]\nmicro_batch_size: [4]\n").stored()
    assert both["backend"] == ["deepspeed", "fsdp2"] and "fsdp" in both
