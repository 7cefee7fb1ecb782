"""Real FSDP2 on 2 CPU ranks (gloo): each ``fully_shard`` setting of a candidate reaches the
model, as the rank reads it from the model's FSDP2 states after sharding
(``RankReport.sharding``), DeepSpeed and FSDP2 candidates take turns in one launch of
warm ranks, no rank ever holds the whole model (its parameters are built on the meta
device), and a loss check's FSDP2 runs start from the seeded weights and train as
DeepSpeed's fp32 ZeRO-0 does."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.backends import get_backend
from autotune.candidate import Candidate, FsdpKnobs
from autotune.execution import launch_probes
from autotune.execution.launch import ProbeJob
from autotune.protocol import LossRun, ProbeSpec, RankReport, ShardingState
from autotune.study.loss_comparison import ComparedRun, compare
from tests.support.paths import ASSETS
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


def test_no_rank_holds_the_whole_model(tmp_path: Path) -> None:
    """A rank builds the parameters on the meta device and allocates only its shards: its
    tracked peak stays near its half of the fp32 weights. Built whole before sharding, a
    rank's peak held the whole fp32 model (the frozen blocks train with little more)."""
    job = make_job(tmp_path, candidate=_fsdp2(gradient_accumulation_steps=1))
    workload = f"{ASSETS / 'frozen_blocks_workload.py'}:make"
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"workload": workload})})
    (result,) = launch_probes([job])
    assert result.status == "ok", result.error + result.log_tail
    builds = [report.build for report in _rank_reports(Path(job.trial_dir))]
    assert builds[0] is not None
    whole_fp32_bytes = 4 * builds[0].model_param_count
    for peak in result.peak_bytes_per_rank:
        assert whole_fp32_bytes / 2 < peak < 0.75 * whole_fp32_bytes, (peak, whole_fp32_bytes)
    assert all(b is not None and (b.device, b.param_bytes) == ("meta", 0) for b in builds)


def _loss_run_job(root: Path, name: str, candidate: Candidate) -> ProbeJob:
    spec = ProbeSpec(
        workload="gpt-tiny",
        candidate=candidate,
        backend_config=get_backend(candidate.backend).render_config(candidate),
        accelerator="cpu",
        vram_limit_bytes=8 * 2**30,
        device_memory_bytes=24 * 2**30,
        loss_run=LossRun(steps=4, seed=7),
    )
    return ProbeJob(
        spec=spec, trial_dir=str(root / name), world_size=2, timeout_s=600,
        threads_per_rank=1, cwd=str(root),
    )  # fmt: skip


def test_fsdp2_loss_checks_start_from_the_seeded_weights_and_train_the_same(
    tmp_path: Path,
) -> None:
    """``autotune verify``'s FSDP2 runs (parameters built on meta, the seeded weights loaded
    whole on the host, then sharded) start from DeepSpeed's weights, exactly in fp32, and
    train the same whatever the split of the batch and with CPU offload."""
    deepspeed = Candidate(
        precision="fp32", zero_stage=0, micro_batch_size=4, gradient_accumulation_steps=1,
        data_parallel_size=2,
    )  # fmt: skip
    runs = {
        "deepspeed": deepspeed,
        "reference": _fsdp2(precision="fp32", micro_batch_size=4, gradient_accumulation_steps=1),
        "accumulated": _fsdp2(precision="fp32", micro_batch_size=2),
        "offloaded": _fsdp2(
            precision="fp32", micro_batch_size=4, gradient_accumulation_steps=1,
            offload_optimizer="cpu", offload_param="cpu",
        ),
    }  # fmt: skip
    results = launch_probes([_loss_run_job(tmp_path, name, c) for name, c in runs.items()])
    traces = {}
    for name, result in zip(runs, results, strict=True):
        assert result.status == "ok", (name, result.error + result.log_tail)
        assert result.loss_trace is not None
        traces[name] = ComparedRun(candidate=runs[name], trace=result.loss_trace)
    assert len({run.trace.initial_weights_sha256 for run in traces.values()}) == 1
    for name in ("reference", "accumulated", "offloaded"):
        trace = traces[name].trace
        assert trace.loaded_weights_sq_sum == trace.initial_weights_sq_sum
        # the first step's loss and gradient norm, from the same weights (a tied embedding
        # kept tied), as DeepSpeed's
        first = traces["deepspeed"].trace
        assert trace.losses[0] == pytest.approx(first.losses[0], rel=1e-6)
        assert trace.grad_norms[0] == pytest.approx(first.grad_norms[0], rel=1e-6)
    for name in ("accumulated", "offloaded"):
        verdict = compare(traces["reference"], traces[name])
        assert verdict.verdict == "trains the same", (name, verdict.text)
