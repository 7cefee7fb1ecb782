"""Real DeepSpeed probes on 2 CPU ranks through torchrun: status classification, cleanup,
and candidates probed one after another in the same ranks.

A CUDA out-of-memory cannot happen on this CPU machine; the OOM here is the real CPU limit
enforced by the tensor-memory tracker, and the crash, hang and leak are injected faults of
the probe (ProbeSpec.fault), named as such.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autotune.backends import get_backend
from autotune.candidate import Candidate, ZeroKnobs
from autotune.execution.launch import (
    ProbeJob,
    launch_probe,
    launch_probes,
    probe_command,
    read_reports,
)
from tests.support.probe_jobs import CANDIDATE, make_job
from tests.support.processes import probe_processes

DEEPSPEED = get_backend("deepspeed")

pytestmark = pytest.mark.slow


def assert_no_probe_left() -> None:
    deadline = time.monotonic() + 10
    while probe_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert probe_processes() == []


def test_ok_probe_measures_throughput_and_memory(tmp_path: Path) -> None:
    result = launch_probe(make_job(tmp_path))
    assert result.status == "ok", result.error + result.log_tail
    assert result.samples_per_s > 0 and len(result.step_times_s) == 3
    assert result.tokens_per_s == pytest.approx(result.samples_per_s * 64)
    assert result.samples_per_s_min <= result.samples_per_s <= result.samples_per_s_max
    assert len(result.peak_bytes_per_rank) == 2 and min(result.peak_bytes_per_rank) > 1_000_000
    assert result.threads_per_rank == 1
    assert result.exit_code == 0
    assert result.versions["deepspeed"]
    import transformers

    assert result.versions["transformers"] == transformers.__version__  # from its metadata
    log = (tmp_path / "trial" / "probe.log").read_text()
    assert "terminate called" not in log and "Traceback" not in log
    assert (tmp_path / "trial" / "ds_config.json").is_file()
    assert_no_probe_left()


def test_a_forked_cpu_rank_runs_with_the_threads_of_its_launch(tmp_path: Path) -> None:
    """CPU ranks are forked from a launcher that imported their code with one OpenMP
    thread; each rank runs with the launch's threads, as a rank of its own program would."""
    job = make_job(tmp_path, candidate=CANDIDATE.model_copy(update={"data_parallel_size": 1}))
    job = job.model_copy(update={"world_size": 1, "threads_per_rank": 2})
    assert "autotune.probe.fork_ranks" in probe_command(job, [])
    result = launch_probe(job)
    assert result.status == "ok", result.error + result.log_tail
    assert result.threads_per_rank == 2
    assert_no_probe_left()


def test_rank_over_the_memory_limit_is_oom(tmp_path: Path) -> None:
    result = launch_probe(make_job(tmp_path, limit_bytes=2 * 2**20))
    assert result.status == "oom", result.error + result.log_tail
    assert "exceeds the limit of 2097152 bytes" in result.error
    assert_no_probe_left()


def test_crashed_rank_is_error_naming_the_rank(tmp_path: Path) -> None:
    result = launch_probe(make_job(tmp_path, fault="crash"))
    assert result.status == "error"
    assert "rank 1 died first" in result.error and "SIGKILL" in result.error
    assert_no_probe_left()


def test_hung_rank_is_killed_at_the_timeout(tmp_path: Path) -> None:
    result = launch_probe(make_job(tmp_path, fault="hang", timeout_s=20))
    assert result.status == "timeout"
    assert_no_probe_left()


def test_adaptive_length_and_early_stop_in_one_warm_group(tmp_path: Path) -> None:
    """Warm-up until steps settle, timing until the interval is tight (or the cap), and an
    early stop once clearly slower than a threshold; all ranks stop after the same step."""
    from autotune.execution._worker import WarmWorker

    worker = WarmWorker()
    try:
        base = make_job(tmp_path)
        adaptive = base.model_copy(
            update={
                "trial_dir": str(tmp_path / "adaptive"),
                "spec": base.spec.model_copy(
                    update={
                        "max_warmup_steps": 6,
                        "timed_steps": 3,
                        "max_timed_steps": 12,
                        # Loose enough that three steps settle it whatever the noise
                        # here (three steps at 0.13, 0.13, 0.18 s already miss 0.5).
                        "target_spread": 10.0,
                    }
                ),
            }
        )
        result = worker.run(adaptive)
        assert result.status == "ok", result.error + result.log_tail
        assert len(result.step_times_s) == 3 and 1 <= result.warmup_steps <= 6
        assert not result.stopped_early

        tight = adaptive.model_copy(
            update={
                "trial_dir": str(tmp_path / "tight"),
                "spec": adaptive.spec.model_copy(
                    update={"target_spread": 1e-6, "max_timed_steps": 7}
                ),
            }
        )
        result = worker.run(tight)
        assert result.status == "ok" and len(result.step_times_s) == 7  # hit the cap

        hopeless = adaptive.model_copy(
            update={
                "trial_dir": str(tmp_path / "hopeless"),
                "spec": adaptive.spec.model_copy(
                    # Above samples / 1e-9 s, the floor of the interval's fast end, so
                    # three steps decide it however wide their interval is.
                    update={"target_spread": 1e-6, "stop_below_samples_per_s": 1e15}
                ),
            }
        )
        result = worker.run(hopeless)
        assert result.status == "ok" and result.stopped_early
        assert len(result.step_times_s) == 3  # the minimum for a verdict
    finally:
        worker.close()
    assert_no_probe_left()


def test_a_crash_in_a_shared_launch_fails_only_its_own_candidate(tmp_path: Path) -> None:
    """Candidates probed in one launch: the first finished on every rank before the second
    crashed the launch, so it stays ``ok``; the second is the error."""
    first = make_job(tmp_path).model_copy(update={"trial_dir": str(tmp_path / "a")})
    second = make_job(tmp_path, fault="crash").model_copy(update={"trial_dir": str(tmp_path / "b")})
    ok, crashed = launch_probes([first, second])
    assert ok.status == "ok" and ok.samples_per_s > 0, ok.error
    assert crashed.status == "error" and "rank 1 died first" in crashed.error
    assert_no_probe_left()


def test_after_a_failed_launch_the_next_groups_candidates_are_not_probed(
    tmp_path: Path,
) -> None:
    """A candidate that asks for TF32 needs ranks of its own (its environment differs);
    after the launch before it failed, it is reported not probed, never launched."""
    crash = make_job(tmp_path, fault="crash").model_copy(update={"trial_dir": str(tmp_path / "a")})
    tf32 = make_job(tmp_path).model_copy(update={"trial_dir": str(tmp_path / "b")})
    tf32 = tf32.model_copy(
        update={"spec": tf32.spec.model_copy(update={"float32_matmul_precision": "high"})}
    )
    crashed, after = launch_probes([crash, tf32])
    assert crashed.status == "error" and "died first" in crashed.error
    assert after.status == "error" and after.error.startswith("not probed"), after.error
    assert not read_reports(tf32)
    assert_no_probe_left()


# Candidates probed one after another in the same ranks. SMALL_BUCKETS keeps ZeRO's default
# ~1.9 GiB of buckets per rank out of the way, so that what one candidate leaves behind is a
# large share of the next one's peak.
SMALL_BUCKETS = ZeroKnobs(reduce_bucket_size=5_000_000, allgather_bucket_size=5_000_000)
BIG = Candidate(
    precision="fp32",
    zero_stage=1,
    micro_batch_size=4,
    gradient_accumulation_steps=1,
    data_parallel_size=2,
    zero_knobs=SMALL_BUCKETS,
)
SMALL = Candidate(
    precision="bf16",
    zero_stage=0,
    micro_batch_size=2,
    gradient_accumulation_steps=1,
    data_parallel_size=2,
)
ZERO3 = Candidate(
    precision="bf16",
    zero_stage=3,
    micro_batch_size=2,
    gradient_accumulation_steps=1,
    data_parallel_size=2,
    zero_knobs=ZeroKnobs(reduce_bucket_size=5_000_000, stage3_prefetch_bucket_size=5_000_000),
)
GPT_TINY_PARAMS = 929_280


def sequence_job(root: Path, name: str, candidate: Candidate, **spec: object) -> ProbeJob:
    job = make_job(root, candidate=candidate)
    return job.model_copy(
        update={
            "trial_dir": str(root / name),
            "spec": job.spec.model_copy(update={"timed_steps": 2, **spec}),
        }
    )


@pytest.fixture(scope="module")
def sequences(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[ProbeJob, object]]:
    """Two launches of several candidates each: BIG, ZERO3, SMALL, then SMALL with TF32
    ("high": the ranks cannot serve it, the TF32 override of a process's environment is
    read once, so it starts a launch of its own); SMALL alone, then ZERO3 with the "leak"
    fault (it keeps its model and a tensor alive), then SMALL again. The driver's
    environment exports the TF32 override, as NGC's PyTorch containers do."""
    root = tmp_path_factory.mktemp("sequences")
    first = [
        sequence_job(root, "big", BIG),
        # DeepSpeed's ZeRO-3 objects outlive destroy(): what they held must not count next
        sequence_job(root, "zero3", ZERO3),
        sequence_job(root, "small_after_big", SMALL),
        sequence_job(root, "small_tf32", SMALL, float32_matmul_precision="high"),
    ]
    second = [
        sequence_job(root, "small_alone", SMALL),
        sequence_job(root, "zero3_leaking", ZERO3, fault="leak"),
        sequence_job(root, "small_after_leak", SMALL),
    ]
    jobs = first + second
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "1")
        results = launch_probes(first) + launch_probes(second)
    assert_no_probe_left()
    return {Path(j.trial_dir).name: (j, r) for j, r in zip(jobs, results, strict=True)}


def test_a_candidate_after_another_in_the_same_ranks_measures_as_alone(sequences) -> None:
    """Every reference to an engine is dropped before the collection: the next candidate
    starts from nothing, so its peak is its own (on CPU the tracker counts what is still
    alive, as the CUDA allocator would)."""
    (after_job, after), (_, alone) = sequences["small_after_big"], sequences["small_alone"]
    assert after.status == alone.status == "ok", after.error + alone.error
    assert not after.cold_start and after.leak_restart_bytes == 0  # probed warm, no restart
    reports = read_reports(after_job)
    assert len(reports) == after_job.world_size
    assert all(r.leaked_bytes == 0 for r in reports)
    for warm, cold in zip(after.peak_bytes_per_rank, alone.peak_bytes_per_rank, strict=True):
        assert warm == pytest.approx(cold, rel=0.01)


def test_each_probe_applies_its_own_float32_matmul_precision(sequences) -> None:
    """Each probe sets the study's precision, and its ranks' environment the study's TF32
    override explicitly: the driver's (1, forcing TF32 on CUDA) is not inherited."""
    _, after = sequences["small_after_big"]
    _, tf32 = sequences["small_tf32"]
    assert tf32.versions["float32_matmul_precision"] == "high"
    assert tf32.versions["cuda_matmul_allow_tf32"] == "True"
    assert tf32.versions["tf32_cublas_override"] == "1"
    assert tf32.cold_start  # not in the ranks of the candidates before it
    assert after.versions["float32_matmul_precision"] == "highest"
    assert after.versions["cuda_matmul_allow_tf32"] == "False"
    assert after.versions["tf32_cublas_override"] == "0"


def test_zero3_builds_partitioned_under_zero_init_other_stages_in_their_dtype(sequences) -> None:
    job, result = sequences["zero3_leaking"]
    assert result.status == "ok" and len(result.step_times_s) == 2, result.error
    reports = read_reports(job)
    assert len(reports) == job.world_size == 2
    for report in reports:
        build = report.build
        assert build is not None and build.zero_init and build.partitioned
        assert build.model_param_count == GPT_TINY_PARAMS
        # bf16 (zero.Init casts to the config's dtype), half of the model on each of 2 ranks
        assert build.dtype == "bfloat16" and build.param_bytes == GPT_TINY_PARAMS * 2 // 2
    for name, dtype, width in (("big", "float32", 4), ("small_alone", "bfloat16", 2)):
        reports = read_reports(sequences[name][0])
        assert len(reports) == sequences[name][0].world_size
        for report in reports:
            assert report.build is not None and not report.build.zero_init
            assert (report.build.dtype, report.build.device) == (dtype, "cpu")
            assert report.build.param_bytes == GPT_TINY_PARAMS * width


def test_ranks_that_find_a_leak_restart_and_probe_cold(sequences) -> None:
    """The "leak" fault keeps ZERO3's model and 2x the tolerance alive: the next candidate's
    ranks refuse it (unclean) and a fresh launch probes it, cold."""
    from autotune.probe._rank_memory import leak_tolerance_bytes

    (_, leaking), (_, restarted) = sequences["zero3_leaking"], sequences["small_after_leak"]
    (_, alone) = sequences["small_alone"]
    assert leaking.status == "ok" and not leaking.cold_start
    assert restarted.status == "ok", restarted.error
    assert restarted.cold_start
    assert restarted.leak_restart_bytes >= 2 * leak_tolerance_bytes(8 * 2**30)
    assert restarted.peak_bytes_per_rank == pytest.approx(alone.peak_bytes_per_rank, rel=0.01)


# A micro-batch large enough that its activations take hundreds of MiB of host memory.
LARGE_BATCH = Candidate(
    precision="fp32",
    zero_stage=1,
    micro_batch_size=64,
    gradient_accumulation_steps=1,
    data_parallel_size=2,
    zero_knobs=SMALL_BUCKETS,
)


def test_each_candidate_in_warm_ranks_reports_its_own_host_peak(tmp_path: Path) -> None:
    """The kernel's high-water mark of resident memory is reset at each candidate's start:
    a small candidate after a large one in the same ranks reports its own peak, as alone,
    not the process's lifetime maximum."""
    large, after = launch_probes(
        [sequence_job(tmp_path, "large", LARGE_BATCH), sequence_job(tmp_path, "after", SMALL)]
    )
    (alone,) = launch_probes([sequence_job(tmp_path, "alone", SMALL)])
    for result in (large, after, alone):
        assert result.status == "ok", result.error + result.log_tail
        assert result.host_peak_method == "kernel_hwm"
        assert len(result.node_per_rank) == 2 and len(set(result.node_per_rank)) == 1
    assert not after.cold_start and alone.cold_start
    for large_bytes, after_bytes, alone_bytes in zip(
        large.host_peak_bytes_per_rank,
        after.host_peak_bytes_per_rank,
        alone.host_peak_bytes_per_rank,
        strict=True,
    ):
        assert after_bytes < large_bytes - 200 * 2**20  # not the large candidate's peak
        assert after_bytes == pytest.approx(alone_bytes, rel=0.15)
    assert_no_probe_left()


def test_a_warm_worker_restarts_unclean_ranks_and_removes_scratch(tmp_path: Path) -> None:
    from autotune.execution._worker import WarmWorker
    from autotune.probe._rank_memory import leak_tolerance_bytes

    def job(name: str, candidate: Candidate, **spec: object) -> ProbeJob:
        return sequence_job(tmp_path, name, candidate, **spec).model_copy(
            update={"scratch_dir": str(tmp_path / "swap" / name)}
        )

    worker = WarmWorker()
    try:
        leaking = worker.run(job("leaking", SMALL, fault="leak"))
        assert leaking.status == "ok" and leaking.cold_start, leaking.error
        first_group = worker.pid
        assert not (tmp_path / "swap" / "leaking").exists()  # removed after the probe
        restarted = worker.run(job("restarted", SMALL))
        assert restarted.status == "ok" and restarted.cold_start, restarted.error
        assert restarted.leak_restart_bytes >= 2 * leak_tolerance_bytes(8 * 2**30)
        assert worker.pid != first_group
        assert not (tmp_path / "swap" / "restarted").exists()
        clean = worker.run(job("clean", SMALL))
        assert clean.status == "ok" and not clean.cold_start and clean.leak_restart_bytes == 0
        assert clean.peak_bytes_per_rank == pytest.approx(restarted.peak_bytes_per_rank, rel=0.01)
        failed = worker.run(job("failed", SMALL, fault="error"))
        assert failed.status == "error"
        assert not (tmp_path / "swap" / "failed").exists()  # whatever the outcome
    finally:
        worker.close()
    assert_no_probe_left()


def test_modules_in_the_working_folder_shadow_nothing(tmp_path: Path) -> None:
    """A user's folder with a yaml.py, torch.py or json.py of its own: the probe's launcher
    and ranks import the real packages (only a workload file's folder goes on the path)."""
    for name in ("yaml", "torch", "json", "deepspeed"):
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('shadowed {name}')\n")
    result = launch_probe(make_job(tmp_path, timeout_s=240))
    assert result.status == "ok", result.error + result.log_tail[-2000:]
    assert "shadowed" not in result.log_tail


# A workload file (user code, imported by each rank) that counts, in a file per process, the
# calls that reach DeepSpeed's accelerator's own reset_peak_memory_stats: the class's method,
# which the probe's guard shadows on the accelerator object while a candidate runs.
RESET_COUNTING_WORKLOAD = """
import os

from deepspeed.accelerator import get_accelerator

from autotune.workloads import get_workload

_accelerator_class = type(get_accelerator())


def _counting(name):
    method = getattr(_accelerator_class, name)

    def counted(self, *args, **kwargs):
        with open(os.path.join({folder!r}, f"{{name}}-{{os.getpid()}}.txt"), "a") as calls:
            calls.write("call\\n")
        return method(self, *args, **kwargs)

    setattr(_accelerator_class, name, counted)


# the resets that reach the accelerator's own method; empty_cache, which ZeRO-1/2's
# deepspeed.runtime.utils.empty_cache() calls right before its reset: the path was taken
_counting("reset_peak_memory_stats")
_counting("empty_cache")


def gpt_tiny():
    return get_workload("gpt-tiny")
"""
# ZeRO-1 in bf16 with fp32 gradient accumulation and no offload: DeepSpeed's bf16 optimizer,
# whose set-up calls see_memory_usage(force=True) on rank 0 (deepspeed/runtime/bf16_optimizer.py)
BF16_OPTIMIZER = Candidate(
    precision="bf16",
    zero_stage=1,
    micro_batch_size=2,
    gradient_accumulation_steps=1,
    data_parallel_size=2,
    zero_knobs=SMALL_BUCKETS,
)


# ZeRO-2: its optimizer's set-up calls deepspeed.runtime.utils.empty_cache(), which resets
# the peak counters on every rank (deepspeed/runtime/zero/stage_1_and_2.py)
ZERO2 = BF16_OPTIMIZER.model_copy(update={"precision": "fp32", "zero_stage": 2})


@pytest.mark.parametrize(
    ("candidate", "data_types", "path_taken"),
    [
        (BF16_OPTIMIZER, {"grad_accum_dtype": "fp32"}, "begin bf16_optimizer"),
        (ZERO2, {}, None),
    ],
    ids=["bf16-optimizer", "zero2"],
)
def test_deepspeed_cannot_reset_the_peak_counters_during_a_candidate(
    tmp_path: Path, candidate: Candidate, data_types: dict, path_taken: str | None
) -> None:
    """DeepSpeed resets the accelerator's peak counters inside ``initialize`` (the bf16
    optimizer's see_memory_usage(force=True) on rank 0; ZeRO-1/2's empty_cache() on every
    rank): on CUDA a rank would forget the build's and initialize's peak. The path is taken
    (its message is in the log), and no call reaches the accelerator's own reset while the
    candidate runs."""
    counts = tmp_path / "counts"
    counts.mkdir()
    workload = tmp_path / "counting_workload.py"
    workload.write_text(RESET_COUNTING_WORKLOAD.format(folder=str(counts)), encoding="utf-8")
    job = make_job(tmp_path, candidate=candidate)
    config = {**job.spec.backend_config, **({"data_types": data_types} if data_types else {})}
    spec = job.spec.model_copy(
        update={"workload": f"{workload}:gpt_tiny", "backend_config": config, "timed_steps": 2}
    )
    result = launch_probe(job.model_copy(update={"spec": spec}))
    assert result.status == "ok", result.error + result.log_tail
    calls = {
        name: [line for path in counts.glob(f"{name}-*.txt") for line in path.read_text().split()]
        for name in ("reset_peak_memory_stats", "empty_cache")
    }
    if path_taken is None:  # DeepSpeed's set-up ran its empty_cache(): a reset was due
        assert calls["empty_cache"]
    else:
        assert path_taken in (tmp_path / "trial" / "probe.log").read_text()
    assert calls["reset_peak_memory_stats"] == []
    assert_no_probe_left()
