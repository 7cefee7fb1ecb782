"""Search spaces: YAML validation, hardware filtering, accumulation arithmetic, suggestion."""

from __future__ import annotations

import optuna
import pytest

from autotune.backends import get_backend
from autotune.candidate import Candidate
from autotune.errors import SpaceError
from autotune.space import load_space, parse_space
from autotune.space.search_space import SpaceSpec, builtin_space_names, combination_problem
from tests.support.hardware import CPU

AMPERE = CPU.model_copy(
    update={"accelerator": "cuda", "device_name": "A100", "precisions": ("fp32", "bf16", "fp16")}
)

DEEPSPEED = get_backend("deepspeed")
VOLTA = AMPERE.model_copy(update={"device_name": "V100", "precisions": ("fp32", "fp16")})


def test_builtin_default_space_is_packaged() -> None:
    assert "default" in builtin_space_names()
    spec = load_space("default")
    assert spec.zero_stage == [0, 1, 2, 3]
    assert set(spec.precision) == {"fp32", "bf16", "fp16"}


def test_hardware_filters_precision() -> None:
    spec = load_space("default")
    cpu = spec.bind(CPU, data_parallel_size=2, global_batch=16)
    assert cpu.precisions == ("fp32", "bf16")
    assert any("fp16 not supported on cpu" in note for note in cpu.notes)
    assert spec.bind(VOLTA, data_parallel_size=2, global_batch=16).precisions == ("fp32", "fp16")
    ampere = spec.bind(AMPERE, data_parallel_size=2, global_batch=64, nvme_path="/nvme")
    assert ampere.notes == ("fp16 dropped for fsdp2: it needs a gradient scaler; bf16 does not",)
    assert ampere.backends == ("deepspeed", "fsdp2")


def test_accumulation_arithmetic() -> None:
    spec = parse_space("micro_batch_size: [1, 2, 3, 4, 8, 16, 32]\nprecision: [fp32]")
    bound = spec.bind(CPU, data_parallel_size=2, global_batch=32)
    assert bound.micro_batch_sizes == (1, 2, 4, 8, 16)  # 3 and 32 do not divide 16 per rank
    for candidate in bound.candidates():
        assert candidate.train_batch_size == 32
        assert (
            candidate.micro_batch_size
            * candidate.gradient_accumulation_steps
            * candidate.data_parallel_size
            == 32
        )
    by_mb = {c.micro_batch_size: c.gradient_accumulation_steps for c in bound.candidates()}
    assert by_mb == {1: 16, 2: 8, 4: 4, 8: 2, 16: 1}


def test_global_batch_not_divisible_by_ranks() -> None:
    with pytest.raises(SpaceError, match="not divisible by the 4 data-parallel ranks"):
        load_space("default").bind(CPU, data_parallel_size=4, global_batch=18)


def test_no_micro_batch_divides() -> None:
    spec = parse_space("micro_batch_size: [4, 8]")
    with pytest.raises(SpaceError, match=r"no micro_batch_size in \[4, 8\] divides the per-rank"):
        spec.bind(CPU, data_parallel_size=2, global_batch=6)


def test_no_precision_left() -> None:
    spec = parse_space("precision: [fp16]\nmicro_batch_size: [1]")
    with pytest.raises(SpaceError, match="supports only"):
        spec.bind(CPU, data_parallel_size=1, global_batch=1)


def test_validity_rules() -> None:
    assert combination_problem(0, "cpu", "none") is not None
    assert combination_problem(2, "none", "cpu") is not None
    assert combination_problem(3, "cpu", "cpu") is None
    assert combination_problem(3, "nvme", "none") is None
    assert combination_problem(3, "nvme", "nvme") is None
    for stage in (0, 1, 2):
        assert "needs zero_stage 3" in (combination_problem(stage, "nvme", "none") or "")
    spec = parse_space(
        "precision: [fp32]\noffload_optimizer: [none, cpu]\noffload_param: [none, cpu]\n"
        "micro_batch_size: [1]"
    )
    candidates = list(spec.bind(CPU, data_parallel_size=1, global_batch=1).candidates())
    for c in candidates:
        assert combination_problem(c.zero_stage, c.offload_optimizer, c.offload_param) is None
    # stage 0: 1; stages 1-2: 2 each; stage 3: 2 x 2
    assert len(candidates) == 1 + 2 + 2 + 4


def test_stage_without_valid_offload_is_dropped() -> None:
    spec = parse_space("precision: [fp32]\noffload_optimizer: [cpu]\nmicro_batch_size: [1]")
    bound = spec.bind(CPU, data_parallel_size=1, global_batch=1)
    assert bound.zero_stages == (1, 2, 3)
    only_param = parse_space("offload_param: [cpu]\nzero_stage: [1, 2]\nmicro_batch_size: [1]")
    with pytest.raises(SpaceError, match="needs zero_stage 3"):
        only_param.bind(CPU, data_parallel_size=1, global_batch=1)


def test_suggest_stays_in_the_valid_set() -> None:
    spec = parse_space(
        "offload_optimizer: [none, cpu]\noffload_param: [none, cpu]\n"
        "micro_batch_size: [1, 2, 4, 8]\nactivation_checkpointing: [false, true]"
    )
    bound = spec.bind(CPU, data_parallel_size=2, global_batch=16)
    valid = {c.key for c in bound.candidates()}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(300):
        trial = study.ask()
        candidate = bound.suggest(trial)
        assert candidate.key in valid
        assert bound.params_of(candidate) == trial.params
        seen.add(candidate.key)
        study.tell(trial, 0.0)
    assert len(seen) > len(valid) // 2


def test_params_of_enqueues_exactly_that_candidate() -> None:
    bound = load_space("default").bind(CPU, data_parallel_size=2, global_batch=16)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    for candidate in list(bound.candidates())[::7]:
        study.enqueue_trial(bound.params_of(candidate))
        trial = study.ask()
        assert bound.suggest(trial) == candidate
        study.tell(trial, 0.0)


def test_world_sizes_searched_keep_one_global_batch() -> None:
    """``--gpus 1-4`` at a global batch of 8: each world size with the micro-batches its
    share allows (3 ranks take none and are dropped with a note); Optuna asks each under a
    name of its own where its choices differ, and every candidate trains on 8 samples."""
    spec = parse_space("micro_batch_size: [2, 4, 8]\nprecision: [fp32]\nzero_stage: [0, 1]")
    bound = spec.bind(CPU, data_parallel_size=4, global_batch=8, world_sizes=(1, 2, 3, 4))
    assert bound.world_sizes == (1, 2, 4) and bound.data_parallel_size == 4
    assert bound.micro_batch_sizes_by_world == {1: (2, 4, 8), 2: (2, 4), 4: (2,)}
    assert any(note.startswith("3 rank(s) dropped from the world sizes") for note in bound.notes)
    candidates = list(bound.candidates())
    assert {c.data_parallel_size for c in candidates} == {1, 2, 4}
    assert all(c.train_batch_size == 8 for c in candidates)
    assert len(candidates) == 2 * (3 + 2 + 1)
    assert bound.dimensions()["data_parallel_size"] == {"1": 6, "2": 4, "4": 2}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(100):
        trial = study.ask()
        candidate = bound.suggest(trial)
        assert candidate.key in {c.key for c in candidates}
        assert bound.params_of(candidate) == trial.params
        seen.add(candidate.key)
        study.tell(trial, 0.0)
    assert len(seen) == len(candidates)
    one = spec.bind(CPU, data_parallel_size=2, global_batch=8)
    assert one.world_sizes == (2,) and "data_parallel_size" not in one.dimensions()
    with pytest.raises(SpaceError, match="no world size of 3, 5 takes a micro_batch_size"):
        spec.bind(CPU, data_parallel_size=5, global_batch=8, world_sizes=(3, 5))


def test_candidate_is_hashable_and_keyed() -> None:
    a = Candidate(
        precision="bf16",
        zero_stage=2,
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        data_parallel_size=2,
    )
    b = Candidate(
        precision="bf16",
        zero_stage=2,
        micro_batch_size=4,
        gradient_accumulation_steps=2,
        data_parallel_size=2,
    )
    assert a == b and hash(a) == hash(b) and a.key == b.key
    assert len({a, b}) == 1
    assert a.label == "z2 bf16 mb4x2"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "precision: [fp32]\nmicro_batch_size: [1]\ncolour: [red]\n",
            r"space.yaml:3: unknown key 'colour'; allowed keys: precision, zero_stage",
        ),
        (
            "precision: [fp8]\nmicro_batch_size: [1]\n",
            r"space.yaml:1: precision\[0\]: Input should be 'fp32', 'bf16' or 'fp16', got 'fp8'",
        ),
        ("zero_stage: [4]\nmicro_batch_size: [1]\n", r"space.yaml:1: zero_stage\[0\]"),
        ("micro_batch_size: []\n", r"space.yaml:1: micro_batch_size: Value error, must list"),
        ("micro_batch_size: [0]\n", r"micro_batch_size\[0\]: Input should be greater than 0"),
        ("precision: [fp32\n", r"space.yaml:2: not valid YAML"),
        ("- a\n- b\n", r"space.yaml: a space is a mapping"),
        ("precision: [fp32]\n", r"space.yaml: micro_batch_size: Field required"),
        ("micro_batch_size: [2, 2]\n", r"lists a value twice"),
    ],
)
def test_space_errors_name_file_key_and_allowed(text: str, message: str) -> None:
    with pytest.raises(SpaceError, match=message):
        parse_space(text, source="space.yaml")


def test_missing_space_file_lists_builtins(tmp_path) -> None:
    with pytest.raises(SpaceError, match=r"--space nope.yaml: no such file.*one of: default"):
        load_space("nope.yaml")
    path = tmp_path / "mine.yaml"
    path.write_text("micro_batch_size: [1, 2]\n")
    assert load_space(str(path)) == SpaceSpec(micro_batch_size=[1, 2])


FULL = """
precision: [fp32, bf16]
zero_stage: [0, 1, 2, 3]
offload_optimizer: [none, cpu]
offload_optimizer_ratio: [0.5, 1.0]
offload_param: [none, cpu]
micro_batch_size: [1, 2, 4]
activation_checkpointing: [false, true]
zero_knobs:
  overlap_comm: [false, true]
  reduce_bucket_size: [5.0e+7, 5.0e+8]
  allgather_bucket_size: [5.0e+8]
  stage3_prefetch_bucket_size: [1.0e+6, 5.0e+7]
"""


def test_fine_knobs_only_where_their_stage_reads_them() -> None:
    bound = parse_space(FULL).bind(CPU, data_parallel_size=2, global_batch=8)
    candidates = list(bound.candidates())
    assert len({c.key for c in candidates}) == len(candidates)
    for c in candidates:
        knobs = dict(c.zero_knobs.items())
        if c.zero_stage == 0:
            assert knobs == {}
        if c.zero_stage in (1, 2):
            assert set(knobs) == {"overlap_comm", "reduce_bucket_size", "allgather_bucket_size"}
        if c.zero_stage == 3:
            assert set(knobs) == {
                "overlap_comm",
                "reduce_bucket_size",
                "stage3_prefetch_bucket_size",
            }
        if c.offload_optimizer_ratio < 1:
            assert c.zero_stage == 3 and c.offload_optimizer == "cpu"
        config = DEEPSPEED.render_config(c)["zero_optimization"]
        for name, value in knobs.items():
            assert config[name] == value
    assert any(c.zero_knobs.reduce_bucket_size == 50_000_000 for c in candidates)


def test_full_space_suggest_and_params_round_trip() -> None:
    bound = parse_space(FULL).bind(CPU, data_parallel_size=2, global_batch=8)
    valid = {c.key for c in bound.candidates()}
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(200):
        trial = study.ask()
        candidate = bound.suggest(trial)
        assert candidate.key in valid
        assert bound.params_of(candidate) == trial.params
        study.tell(trial, 0.0)


def test_partial_offload_dropped_where_deepspeed_lacks_it() -> None:
    bound = parse_space(FULL).bind(
        CPU, data_parallel_size=2, global_batch=8, partial_offload_supported=False
    )
    assert bound.offload_optimizer_ratios == (1.0,)
    assert any("no partial offload" in note for note in bound.notes)


def test_auto_global_batch_searches_accumulation_under_the_cap() -> None:
    spec = parse_space("precision: [fp32]\nzero_stage: [1]\nmicro_batch_size: [2, 4, 8]\n")
    bound = spec.bind(CPU, data_parallel_size=2, global_batch=None, max_global_batch=32)
    shapes = {(c.micro_batch_size, c.gradient_accumulation_steps) for c in bound.candidates()}
    assert shapes == {(2, 1), (2, 2), (2, 4), (2, 8), (4, 1), (4, 2), (4, 4), (8, 1), (8, 2)}
    assert all(c.train_batch_size <= 32 for c in bound.candidates())
    with pytest.raises(SpaceError, match="needs --max-global-batch"):
        spec.bind(CPU, data_parallel_size=2, global_batch=None)


def test_nvme_needs_a_path_and_is_dropped_without_aio() -> None:
    spec = parse_space("offload_optimizer: [none, cpu, nvme]\nmicro_batch_size: [1]\n")
    dropped = spec.bind(CPU, data_parallel_size=1, global_batch=1)
    assert "nvme" not in dropped.offload_optimizer
    assert (
        dropped.notes[-1]
        == "nvme offload dropped: it needs --nvme-path DIR, a folder on an NVMe disk"
    )
    only = parse_space("offload_optimizer: [nvme]\nzero_stage: [3]\nmicro_batch_size: [1]\n")
    with pytest.raises(
        SpaceError, match=r"offload_optimizer lists only 'nvme', but it needs --nvme"
    ):
        only.bind(CPU, data_parallel_size=1, global_batch=1)
    bound = spec.bind(
        CPU, data_parallel_size=1, global_batch=1, nvme_path="/nvme", nvme_unavailable="no libaio"
    )
    assert "nvme" not in bound.offload_optimizer
    assert bound.notes[-1] == "nvme offload dropped: no libaio"
    kept = spec.bind(CPU, data_parallel_size=1, global_batch=1, nvme_path="/nvme")
    assert any(c.offload_optimizer == "nvme" for c in kept.candidates())


def test_nvme_optimizer_offload_only_at_zero3() -> None:
    """DeepSpeed swaps optimizer states to NVMe only at ZeRO-3 (at 1-2 it quietly offloads
    to CPU): no candidate pairs nvme with a lower stage, a space that can only do that is
    one error line, and Optuna gets one fixed set of choices per parameter name."""
    only_low = parse_space("offload_optimizer: [nvme]\nzero_stage: [1, 2]\nmicro_batch_size: [1]")
    for nvme_path in ("/nvme", None):
        with pytest.raises(SpaceError) as error:
            only_low.bind(CPU, data_parallel_size=2, global_batch=2, nvme_path=nvme_path)
        message = str(error.value)
        assert "\n" not in message
        assert "NVMe only at ZeRO-3" in message and "add 3 to zero_stage" in message

    mixed_low = parse_space(
        "offload_optimizer: [cpu, nvme]\nzero_stage: [1, 2]\nmicro_batch_size: [1]"
    )
    bound = mixed_low.bind(CPU, data_parallel_size=2, global_batch=2, nvme_path="/nvme")
    assert bound.offload_optimizer == ("cpu",)
    assert "offload_optimizer nvme dropped: it needs zero_stage 3, not listed" in bound.notes

    spec = parse_space(
        "precision: [fp32]\noffload_optimizer: [none, cpu, nvme]\noffload_param: [none, nvme]\n"
        "offload_optimizer_ratio: [1.0]\nmicro_batch_size: [1, 2]"
    )
    bound = spec.bind(CPU, data_parallel_size=2, global_batch=4, nvme_path="/nvme")
    candidates = list(bound.candidates())
    assert {c.zero_stage for c in candidates if c.offload_optimizer == "nvme"} == {3}
    for c in candidates:
        assert combination_problem(c.zero_stage, c.offload_optimizer, c.offload_param) is None
    # stage 0: 1; stages 1-2: none/cpu; stage 3: 3 optimizer x 2 parameter targets; x 2 mb
    assert len(candidates) == (1 + 2 + 2 + 6) * 2
    assert bound.params_of(candidates[2])["offload_optimizer_z12"] in ("none", "cpu")

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(60):  # raises if a name were asked with two sets of choices
        trial = study.ask()
        candidate = bound.suggest(trial)
        assert bound.params_of(candidate) == trial.params
        seen.add((candidate.zero_stage, candidate.offload_optimizer))
        study.tell(trial, 0.0)
    assert {(1, "cpu"), (2, "none"), (3, "nvme")} <= seen
    assert not any(stage < 3 and opt == "nvme" for stage, opt in seen)


def test_nested_knob_errors_name_the_line() -> None:
    text = "micro_batch_size: [1]\nzero_knobs:\n  overlap: [true]\n"
    with pytest.raises(
        SpaceError, match=r"s.yaml:3: unknown key 'overlap'; allowed keys: overlap_"
    ):
        parse_space(text, source="s.yaml")
    with pytest.raises(SpaceError, match=r"ratios must lie in \(0, 1\]"):
        parse_space("micro_batch_size: [1]\noffload_optimizer_ratio: [1.5]\n")


def test_dimensions_count_candidates() -> None:
    bound = load_space("default").bind(CPU, data_parallel_size=2, global_batch=16)
    dims = bound.dimensions()
    # DeepSpeed: 2 precisions x (1 + 2 + 2 + 3 x 2 offload combinations) x 4 micro-batches
    # x 2 checkpointing = 176; FSDP2: 2 precisions x 2 reshard x 2 offload x 2 checkpointing
    # x (3 accumulating micro-batches x 2 sync + 1) = 112
    assert sum(dims["precision"].values()) == bound.size() == 176 + 112
    assert dims["backend"] == {"deepspeed": 176, "fsdp2": 112}
    assert dims["zero_stage"] == {"0": 16, "1": 32, "2": 32, "3": 96}
    assert dims["offload_optimizer_ratio"] == {"1.0": 144, "0.5": 32}
