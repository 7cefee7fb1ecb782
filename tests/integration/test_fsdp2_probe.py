"""Real FSDP2 on 2 CPU ranks (gloo): each ``fully_shard`` setting of a candidate reaches the
model, as the rank reads it from the model's FSDP2 states after sharding
(``RankReport.sharding``), and DeepSpeed and FSDP2 candidates take turns in one launch of
warm ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.candidate import Candidate, FsdpKnobs
from autotune.execution import launch_probes
from autotune.protocol import RankReport, ShardingState
from tests.support.probe_jobs import CANDIDATE, make_job

pytestmark = pytest.mark.slow


def _fsdp2(**fields: object) -> Candidate:
    knobs = fields.pop("fsdp", FsdpKnobs())
    base = {"precision": "bf16", "micro_batch_size": 4, "gradient_accumulation_steps": 2}
    return Candidate(
        backend="fsdp2", zero_stage=3, data_parallel_size=2, fsdp=knobs, **{**base, **fields}
    )


# gpt-tiny has 2 transformer blocks: per-block wrapping makes 3 units with the root, and
# the root never reshards after forward.
CASES = [
    (
        _fsdp2(fsdp=FsdpKnobs(reshard_after_forward=True)),
        ShardingState(
            units=3, resharded_units=2, post_forward_ranks=2, param_dtype="bfloat16",
            reduce_dtype="float32", offload="OffloadPolicy", shard_device="cpu",
            checkpointed=False, first_micro_batch_reduced=False,
        ),
    ),
    (
        _fsdp2(
            precision="fp32", offload_optimizer="cpu", offload_param="cpu",
            activation_checkpointing=True,
            fsdp=FsdpKnobs(reshard_after_forward=False, sync_each_micro_batch=True),
        ),
        ShardingState(
            units=3, resharded_units=0, post_forward_ranks=0, param_dtype="float32",
            reduce_dtype="float32", offload="CPUOffloadPolicy", shard_device="cpu",
            checkpointed=True, first_micro_batch_reduced=True,
        ),
    ),
    (
        _fsdp2(
            gradient_accumulation_steps=1, micro_batch_size=8,
            fsdp=FsdpKnobs(reshard_after_forward=False, reduce_dtype="bf16", wrap="model"),
        ),
        ShardingState(
            units=1, resharded_units=0, post_forward_ranks=0, param_dtype="bfloat16",
            reduce_dtype="bfloat16", offload="OffloadPolicy", shard_device="cpu",
            checkpointed=False,
        ),
    ),
]  # fmt: skip


def test_each_fully_shard_setting_reaches_the_model(tmp_path: Path) -> None:
    candidates = [CANDIDATE, *(candidate for candidate, _ in CASES)]
    jobs = [
        make_job(tmp_path, candidate=c).model_copy(update={"trial_dir": str(tmp_path / f"t{i}")})
        for i, c in enumerate(candidates)
    ]
    results = launch_probes(jobs)  # one launch: DeepSpeed, then each FSDP2 candidate
    for job, result in zip(jobs, results, strict=True):
        assert result.status == "ok", (job.spec.candidate.label, result.error)
        assert result.samples_per_s > 0
    reports = [_rank_reports(Path(job.trial_dir)) for job in jobs]
    assert all(r.sharding is None for r in reports[0])  # DeepSpeed's engine
    for (candidate, expected), ranks in zip(CASES, reports[1:], strict=True):
        assert [r.sharding for r in ranks] == [expected, expected], candidate.label
        assert all(r.optimizer == "torch.optim.adamw.AdamW" for r in ranks)
        # FSDP2 keeps the shards in the dtype the model was built in
        assert all(r.build is not None and r.build.dtype == "float32" for r in ranks)


def _rank_reports(trial_dir: Path) -> list[RankReport]:
    paths = sorted(trial_dir.glob("rank-*.json"))
    return [RankReport.model_validate_json(path.read_text()) for path in paths]


def test_a_dit_is_sharded_per_block_with_its_embeddings_apart(tmp_path: Path) -> None:
    """diffusers' DiT calls its first block's timestep embedding from outside that block:
    sharded as a unit of its own (Workload.shard_units), the model trains per block."""
    job = make_job(tmp_path, candidate=_fsdp2(precision="fp32"))
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"workload": "dit-tiny"})})
    (result,) = launch_probes([job])
    assert result.status == "ok", result.error
    sharding = _rank_reports(Path(job.trial_dir))[0].sharding
    assert sharding is not None
    assert (sharding.units, sharding.resharded_units) == (5, 4)  # 2 embeddings, 2 blocks, root
