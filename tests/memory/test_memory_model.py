"""The memory model: model facts, traced activations against the probe's own tracker,
calibration, and what a prediction contains."""

from __future__ import annotations

import pytest

from autotune.candidate import Candidate
from autotune.memory import Limits, MemoryScreen
from autotune.memory.activations import profile, trace_once
from autotune.memory.memory_model import Calibration, MemoryModel, model_facts
from autotune.workloads import get_workload
from tests.support.paths import ROOT


def candidate(stage: int, opt: str = "none", param: str = "none", n: int = 4, **kw) -> Candidate:
    return Candidate(
        precision=kw.pop("precision", "bf16"),
        zero_stage=stage,
        offload_optimizer=opt,
        offload_param=param,
        micro_batch_size=2,
        gradient_accumulation_steps=1,
        data_parallel_size=n,
        **kw,
    )


def test_facts_from_the_meta_device() -> None:
    facts = model_facts(get_workload("gpt-tiny"), 100_000)
    assert facts.params == 929_280  # wte tied to lm_head: counted once
    assert facts.largest_param == 4096 * 128
    assert 0 < facts.small_params < facts.params


def test_trace_matches_what_the_probe_tracker_measured() -> None:
    # Measured on 2 CPU ranks with DeepSpeed (ZeRO-0, fp32, micro-batch 2): the forward
    # raised live tensor bytes by 8.69 MiB and backward by 10.69 MiB over the model states.
    act = trace_once(get_workload("gpt-tiny"), 2, "fp32", False, "kept")
    assert act.forward_peak_bytes / 2**20 == pytest.approx(8.69, abs=0.02)
    assert act.backward_peak_bytes / 2**20 == pytest.approx(10.69, abs=0.02)


def test_backward_after_the_blocks_holds_the_embeddings_gradients() -> None:
    # gpt-tiny's tied embedding (4096 x 128 fp32, 2 MiB): its lm_head gradient waits for
    # the embedding's own, then the two are summed, all after the blocks' backward
    act = trace_once(get_workload("gpt-tiny"), 2, "fp32", False, "dropped")
    embedding = 4096 * 128 * 4
    assert 3 * embedding < act.after_blocks_backward_peak_bytes < act.backward_peak_bytes
    assert act.after_blocks_backward_peak_bytes / 2**20 == pytest.approx(6.03, abs=0.02)


def test_backward_in_the_blocks_peaks_apart_from_after_them() -> None:
    # gpt-tiny at 8 tokens: the tied embedding's gradients (2 MiB each) after the blocks
    # outweigh the blocks' activations, so the whole backward peaks after the blocks and
    # the peak until every block has its gradients is lower; at 64 tokens the blocks lead
    from autotune.workloads.config_recipe import recipe
    from autotune.workloads.transformers_lm import CausalLMWorkload

    config = recipe(
        "GPT2Config", "gpt2", "n_layer", n_layer=2, n_embd=128, n_head=4, n_positions=8,
        vocab_size=4096, bos_token_id=0, eos_token_id=0, use_cache=False,
    )  # fmt: skip
    short = CausalLMWorkload("gpt-tiny-8", config, seq_len=8, default_global_batch=16)
    act = trace_once(short, 2, "fp32", False, "dropped")
    assert act.in_blocks_backward_peak_bytes / 2**20 == pytest.approx(2.78, abs=0.02)
    assert act.at_first_grad_bytes < act.in_blocks_backward_peak_bytes
    assert act.in_blocks_backward_peak_bytes < act.backward_peak_bytes
    assert act.backward_peak_bytes <= act.after_blocks_backward_peak_bytes
    kept = trace_once(short, 2, "fp32", False, "kept")  # the blocks' gradients held too
    assert act.in_blocks_backward_peak_bytes < kept.in_blocks_backward_peak_bytes
    assert kept.in_blocks_backward_peak_bytes < kept.backward_peak_bytes
    usual = trace_once(get_workload("gpt-tiny"), 2, "fp32", False, "dropped")
    assert usual.in_blocks_backward_peak_bytes == usual.backward_peak_bytes


def test_checkpointing_and_micro_batch_move_activations() -> None:
    wl = get_workload("gpt-tiny")
    plain, checkpointed = profile(wl, 4, "fp32", False), profile(wl, 4, "fp32", True)
    assert checkpointed.forward_peak_bytes < 0.6 * plain.forward_peak_bytes
    assert profile(wl, 4, "bf16", False).forward_peak_bytes < plain.forward_peak_bytes
    assert profile(wl, 8, "fp32", False).forward_peak_bytes > 1.8 * plain.forward_peak_bytes


def test_layer_extrapolation_matches_the_full_trace() -> None:
    wl = get_workload("gpt2").with_layers(6)
    direct = trace_once(wl, 1, "bf16", False, "dropped")
    extrapolated = profile(wl, 1, "bf16", False, "dropped")  # traced at 1 and 2 layers
    fields = (
        "forward_peak_bytes",
        "backward_peak_bytes",
        "in_blocks_backward_peak_bytes",
        "after_blocks_backward_peak_bytes",
    )
    for field in fields:
        assert getattr(extrapolated, field) == pytest.approx(getattr(direct, field), rel=0.02)


def test_prediction_breaks_down_and_grows_with_what_it_should() -> None:
    model = MemoryModel(get_workload("gpt-tiny"))
    estimate = model.predict(candidate(3, n=2, precision="fp32"))
    assert estimate.phase in ("forward", "backward", "step")
    assert estimate.device.buckets == 500_000_000 * 4  # ZeRO-3 keeps its reduce bucket
    quick = model.predict(candidate(3, n=2, precision="fp32"), stop_above=2**30)
    assert quick.phase == "model states" and quick.device.activations == 0
    assert estimate.device_bytes == int(estimate.device.total)
    small = model.predict(candidate(2, n=2, zero_knobs={"reduce_bucket_size": 1_000_000}))
    assert small.device_bytes < model.predict(candidate(2, n=2)).device_bytes
    offloaded = model.predict(candidate(2, "cpu", n=2))
    assert offloaded.host.optimizer_states > 0
    assert (
        offloaded.device.optimizer_states < model.predict(candidate(2, n=2)).device.optimizer_states
    )
    # on CPU ranks offloaded tensors share the RAM the tracker counts
    assert offloaded.tracked_bytes("cpu") == offloaded.device_bytes + offloaded.host_bytes


def test_calibration_uses_the_same_class_first() -> None:
    calibration = Calibration()
    c2, c3 = candidate(2), candidate(3)
    assert calibration.factor(c2) == 1.0
    calibration.add(c3, 100, 120)
    assert calibration.factor(c2) == pytest.approx(1.2)  # only another class: all probes
    calibration.add(c2, 100, 90)
    calibration.add(c2, 100, 100)
    assert calibration.factor(c2) == pytest.approx(0.95)
    model = MemoryModel(get_workload("gpt-tiny"), calibration=calibration)
    estimate = model.predict(c2.model_copy(update={"data_parallel_size": 2}))
    assert estimate.correction == pytest.approx(0.95)
    assert estimate.device_bytes == int(estimate.device.total * 0.95)


def test_gradient_accumulation_holds_what_deepspeed_holds() -> None:
    """Measured on GPT-2 124M fp32 at 2 CPU ranks
    (benchmarks/search_efficiency/data/table_gpt2-seq32.json): mb1x2 peaks above mb2x1 by
    one fp32 gradient partition at ZeRO-2 (+255 MB) and by one more copy of the tied
    embedding's gradient at ZeRO-1 (+154 MB); at ZeRO-3 not at all."""
    workload = get_workload(f"{ROOT / 'benchmarks' / 'workloads.py'}:gpt2_seq32")
    model = MemoryModel(workload)
    params = model_facts(workload, 100_000).params
    embedding = 50257 * 768

    def peak(stage: int, micro: int, opt: str = "none") -> int:
        return model.predict(
            candidate(stage, opt, n=2, precision="fp32").model_copy(
                update={"micro_batch_size": micro, "gradient_accumulation_steps": 2 // micro}
            )
        ).tracked_bytes("cpu")

    assert peak(2, 1) - peak(2, 2) == pytest.approx(4 * params / 2, rel=0.05)
    assert peak(2, 1, "cpu") - peak(2, 2, "cpu") == pytest.approx(4 * params / 2, rel=0.05)
    assert peak(1, 1) - peak(1, 2) == pytest.approx(4 * embedding, rel=0.1)
    assert abs(peak(3, 1) - peak(3, 2)) < 0.02 * 4 * params / 2


def test_cuda_ranks_are_predicted_with_cudas_kernels() -> None:
    """The model for CUDA ranks traces CUDA's fused attention (no attention matrix kept),
    and the memory screen builds it for the accelerator of its limits."""
    workload = get_workload("gpt-tiny")
    single = candidate(0, n=1).model_copy(update={"micro_batch_size": 16})  # peaks in backward
    on_cpu = MemoryModel(workload).predict(single)
    on_cuda = MemoryModel(workload, accelerator="cuda").predict(single)
    assert on_cuda.device.activations < on_cpu.device.activations
    assert on_cuda.device.params == on_cpu.device.params
    limits = Limits(
        accelerator="cuda",
        vram_limit_bytes=2**30,
        margin=0.05,
        host_ram_bytes=2**34,
        ranks_per_node=1,
    )
    model = MemoryScreen(workload, limits).model
    assert isinstance(model, MemoryModel) and model.accelerator == "cuda"
    assert model.predict(single).device_bytes == on_cuda.device_bytes
