"""The memory screen of a script study (learned from its probes), the same failure across a
precision, and the friendlier Workload factories (no probes; fast)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.candidate import Candidate
from autotune.memory._memory_screen import SameFailures
from autotune.memory.script_memory import ScriptMemoryModel
from autotune.protocol import ModelInfo
from tests.support.paths import ROOT

MODEL = ModelInfo(
    params=1_000_000, trainable_params=1_000_000, largest_param=250_000, small_params=0,
    dtype="float32",
)  # fmt: skip


def _c(mb: int, stage: int = 0, precision: str = "fp32", ckpt: bool = False) -> Candidate:
    return Candidate(
        precision=precision,  # type: ignore[arg-type]
        zero_stage=stage,  # type: ignore[arg-type]
        micro_batch_size=mb,
        gradient_accumulation_steps=16 // (2 * mb),
        data_parallel_size=2,
        activation_checkpointing=ckpt,
    )


def test_nothing_is_predicted_before_a_probe_then_activations_extrapolate() -> None:
    model = ScriptMemoryModel("cpu")
    assert model.predict(_c(4)) is None  # before any probe nothing is ruled out
    # a probe at micro-batch 2: forward activations 1 MB per sample, 3 MB of buffers
    model.learn_probe(_c(2), "ok", MODEL, 2_000_000, 12 * MODEL.params + 2_000_000 + 3_000_000)
    assert model.states is not None
    base = model.states.model_states(_c(2))
    assert base[0].total == pytest.approx(12 * MODEL.params)  # ZeRO-0 fp32: 4 + 8 (Adam)
    predicted = model.predict(_c(8))
    assert predicted is not None
    assert predicted.tracked_bytes("cpu") == pytest.approx(12e6 + 8e6 + 3e6, rel=1e-6)
    # no probe of ZeRO-1 yet: its buffers are unknown, so no prediction
    assert model.predict(_c(8, stage=1)) is None
    # bf16 at ZeRO-0 borrows fp32's activations and buffers, halved by width
    assert model.predict(_c(8, precision="bf16")) is not None


def test_an_oom_gives_the_model_facts_but_no_fit() -> None:
    model = ScriptMemoryModel("cpu")
    model.learn_probe(_c(8), "oom", MODEL, 0, 0)
    assert model.states is not None and model.predict(_c(8)) is None


def test_the_same_failure_across_stages_stops_a_precision() -> None:
    failures = SameFailures()
    dtype = "rank 1: RuntimeError: mat1 and mat2 must have the same dtype, but got {} and BFloat16"
    failures.add(_c(2, 0, "bf16"), dtype.format("Float"), 3)
    assert failures.stopped("bf16") == ""  # one failure is not a pattern
    failures.add(_c(4, 0, "bf16"), dtype.format("Float"), 4)
    assert failures.stopped("bf16") == ""  # the same stage twice may be that stage's bug
    failures.add(_c(2, 2, "bf16"), dtype.replace("rank 1", "rank 0").format("Float"), 7)
    line = failures.stopped("bf16")
    assert "every bf16 probe failed alike (trials 3, 4, 7" in line and "--retry-failed" in line
    assert failures.stopped("fp32") == ""
    failures.add_fit(_c(2, 1, "bf16"))  # a bf16 probe that measured: not the precision's fault
    assert failures.stopped("bf16") == ""


def test_a_minimal_workload_factory_is_enough(tmp_path: Path, monkeypatch) -> None:
    """No tokens_per_sample, no checkpointing, fp32 inputs: the example factory plans, its
    study is named after the workload, checkpointing leaves the space with a note."""
    from autotune.run._resolved_run import resolve_run
    from autotune.settings import RunSettings
    from autotune.workloads import get_workload, workload_study_name

    ref = f"{ROOT}/examples/workload/mlp.py:make"
    workload = get_workload(ref)
    assert workload.tokens_per_sample == 1 and workload_study_name(ref) == "mlp"
    monkeypatch.chdir(tmp_path)
    resolved = resolve_run(
        RunSettings.build(workload=ref, world_sizes=(2,), trials_dir=tmp_path / "trials")
    )
    assert resolved.study_name == "mlp"
    assert not any(c.activation_checkpointing for c in resolved.space.candidates())
    assert any("does not override enable_activation_checkpointing" in n for n in resolved.notes)


def test_the_probe_casts_inputs_to_the_engines_dtype() -> None:
    import torch

    from autotune.probe.rank import make_batch
    from autotune.workloads import get_workload

    workload = get_workload(f"{ROOT}/examples/workload/mlp.py:make")
    batch = make_batch(workload, 4, torch.device("cpu"), "bf16")
    assert batch["features"].dtype == torch.bfloat16 and batch["labels"].dtype == torch.int64

    class Told:
        def make_batch(self, m: int, device: object, dtype: object = None) -> object:
            return dtype

    assert make_batch(Told(), 4, torch.device("cpu"), "fp16") == torch.float16


def _write_cuda_probe(trial_dir: Path, activation_bytes: int, peak_allocated: int) -> int:
    """Two CUDA ranks' reports as a script probe writes them: the allocator's peaks, the
    memory outside it added to the reserved peak, the forward's allocator delta; the
    probe's measured peak (what the study records)."""
    from autotune.protocol import ProbeResult, RankReport

    overhead = 600 * 2**20
    reserved = int(peak_allocated * 1.02) + overhead
    trial_dir.mkdir()
    for rank in (0, 1):
        report = RankReport(
            rank=rank,
            status="ok",
            model=MODEL,
            activation_bytes=activation_bytes,
            peak_allocated_bytes=peak_allocated,
            peak_reserved_bytes=reserved,
            device_overhead_bytes=overhead,
        )
        (trial_dir / f"rank-{rank}.json").write_text(report.model_dump_json(), encoding="utf-8")
    result = ProbeResult(
        status="ok",
        peak_bytes_per_rank=[peak_allocated] * 2,
        reserved_bytes_per_rank=[reserved] * 2,
    )
    return result.peak_bytes


def test_cuda_probe_reports_give_a_prediction(tmp_path: Path) -> None:
    """CUDA ranks report the forward's allocator delta as activation bytes: the model then
    predicts on CUDA as on CPU (a larger micro-batch adds its activations), so the screen
    can prune; reports without activation bytes give no prediction."""
    from autotune.memory.script_memory import read_probe

    states = 12 * MODEL.params
    peak = _write_cuda_probe(tmp_path / "mb2", 2_000_000, states + 2_000_000 + 3_000_000)
    model = ScriptMemoryModel("cuda")
    info, activations = read_probe(str(tmp_path / "mb2"))
    assert activations == 2_000_000
    model.learn_probe(_c(2), "ok", info, activations, peak)
    predicted = model.predict(_c(8))
    assert predicted is not None
    # measured at micro-batch 2, plus six more samples' activations (1 MB each)
    assert predicted.tracked_bytes("cuda") == pytest.approx(peak + 6_000_000, rel=1e-6)

    blind = ScriptMemoryModel("cuda")
    peak = _write_cuda_probe(tmp_path / "no_activations", 0, states + 5_000_000)
    info, activations = read_probe(str(tmp_path / "no_activations"))
    blind.learn_probe(_c(2), "ok", info, activations, peak)
    assert blind.predict(_c(8)) is None
