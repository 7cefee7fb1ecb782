"""Pure logic of the search: probe length decisions, the cost model, the candidate policy
and autotune's Optuna sampler (in an in-memory study, no probes)."""

from __future__ import annotations

import math

import optuna
import pytest

from autotune import timing as steps
from autotune.candidate import Candidate
from autotune.run.cost_model import TERMS, CostModel, WorkloadFacts
from autotune.run.sampler import CandidatePolicy, CandidateSampler, History, shape_key
from autotune.space import load_space
from tests.support.hardware import CPU

FACTS = WorkloadFacts(params=4_000_000, tokens_per_sample=64)


def cand(stage=2, mb=4, precision="fp32", opt="none", param="none", ckpt=False) -> Candidate:
    return Candidate(
        precision=precision,
        zero_stage=stage,
        offload_optimizer=opt,
        offload_param=param,
        micro_batch_size=mb,
        gradient_accumulation_steps=8 // mb,
        data_parallel_size=2,
        activation_checkpointing=ckpt,
    )


# -- probe length ------------------------------------------------------------------------
def test_warm_up_ends_when_steps_settle_or_at_the_cap() -> None:
    assert not steps.warmed_up([5.0], 1, 6)
    assert not steps.warmed_up([5.0, 2.0], 1, 6)  # still falling
    assert steps.warmed_up([5.0, 2.0, 2.05], 1, 6)
    assert not steps.warmed_up([1.0, 1.0], 3, 6)  # the minimum comes first
    assert steps.warmed_up([9.0, 5.0, 3.0, 2.0, 1.5, 1.2], 1, 6)
    assert steps.warmed_up([], 0, 0)


def test_timing_stops_at_two_percent_or_the_caps() -> None:
    steady = [1.0, 1.01, 0.99, 1.0]
    assert steps.timed_enough(steady, min_steps=3, max_steps=20, target=0.02, max_s=60)
    noisy = [1.0, 1.3, 0.8, 1.2]
    assert not steps.timed_enough(noisy, min_steps=3, max_steps=20, target=0.02, max_s=60)
    assert steps.timed_enough(noisy, min_steps=3, max_steps=4, target=0.02, max_s=60)
    assert steps.timed_enough(noisy, min_steps=3, max_steps=20, target=0.02, max_s=4.0)
    assert not steps.timed_enough([1.0], min_steps=3, max_steps=20, target=0.02, max_s=60)
    # 95% interval of the mean, Student's t with n-1 degrees of freedom
    mean, half = steps.mean_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 * 1.0 / math.sqrt(3))


def test_clearly_slower_needs_three_steps_and_the_whole_interval_below() -> None:
    batch = 16
    slow = [1.0, 1.02, 0.98]  # ~16 samples/s
    assert steps.clearly_slower(slow, batch, threshold=20.0)
    assert not steps.clearly_slower(slow, batch, threshold=16.5)  # inside the interval
    assert not steps.clearly_slower(slow[:2], batch, threshold=100.0)
    assert not steps.clearly_slower(slow, batch, threshold=0.0)


# -- cost model --------------------------------------------------------------------------
def test_cost_terms_follow_the_zero_formulas() -> None:
    model = CostModel(FACTS, "cpu", threads=1)
    z2, z3 = model.terms(cand(2, mb=1)), model.terms(cand(3, mb=1))
    assert z3["communication"] > z2["communication"]  # 3 Psi per micro-step vs 1
    plain, ckpt = model.terms(cand(ckpt=True)), model.terms(cand())
    assert plain["compute_fp32"] == pytest.approx(ckpt["compute_fp32"] * 8 / 6)
    offload = model.terms(cand(opt="cpu"))
    assert offload["host_optimizer"] > 0 and offload["device_optimizer"] == 0
    assert model.terms(cand(mb=1))["micro_steps"] == 8 * model.terms(cand(mb=8))["micro_steps"]
    assert model.terms(cand(precision="bf16"))["compute_bf16"] > 0


def test_a_large_all_gather_over_gloo_is_priced_at_its_own_rate() -> None:
    """On CPU ranks the parameters' all-gathers of a model whose partition per rank is large
    (ZeRO-1/2 once a step, ZeRO-3 twice a micro-step) take gloo's large-message rate, so a
    GPT-2 124M's ZeRO-0 ranks above its ZeRO-1 and ZeRO-2 before any probe; a small
    model's partition, and every gather on GPUs, keep the link's rate (the ZeRO formula
    unchanged); across nodes the slower of the two rates holds."""
    from autotune.run.cost_model import (
        _INTER_NODE_BYTES_S,
        _LARGE_ALL_GATHER_BYTES_S,
        _LINK_BYTES_S,
    )

    gpt2 = WorkloadFacts(params=124_000_000, tokens_per_sample=32)
    on_cpu = CostModel(gpt2, "cpu")
    z0, z1, z2 = (cand(stage, mb=2) for stage in (0, 1, 2))
    assert on_cpu.samples_per_s(z0) > max(on_cpu.samples_per_s(z1), on_cpu.samples_per_s(z2))
    link, gather = _LINK_BYTES_S["cpu"], _LARGE_ALL_GATHER_BYTES_S["cpu"]
    reduce_s = 124e6 * 4 / link  # 2 (d-1)/d Psi at d = 2, fp32
    assert on_cpu.terms(z1)["communication"] == pytest.approx(reduce_s + 62e6 * 4 / gather)
    z3 = cand(3, mb=2)  # 4 micro-steps: one reduce-scatter and two all-gathers each
    assert on_cpu.terms(z3)["communication"] == pytest.approx(
        4 * (62e6 * 4 / link + 2 * 62e6 * 4 / gather)
    )
    small = CostModel(FACTS, "cpu")  # 4M parameters: 8 MB a rank
    assert small.terms(cand(1))["communication"] == 3 * 0.5 * 4e6 * 4 / link
    assert small.terms(cand(3))["communication"] == 2 * 3 * 0.5 * 4e6 * 4 / link
    on_gpu = CostModel(gpt2, "cuda")
    assert on_gpu.terms(z1)["communication"] == 3 * 0.5 * 124e6 * 4 / _LINK_BYTES_S["cuda"]
    across = CostModel(gpt2, "cpu", nodes=2)
    network = _INTER_NODE_BYTES_S["cpu"]
    assert across.terms(z1)["communication"] == pytest.approx(
        124e6 * 4 / network + 62e6 * 4 / min(gather, network)
    )


def test_calibration_recovers_the_weights_that_made_the_times() -> None:
    truth = CostModel(FACTS, "cpu")
    truth.weights = dict.fromkeys(TERMS, 1.0) | {"compute_fp32": 3.0, "micro_steps": 0.5}
    observed = [
        cand(stage, mb=mb, opt=opt, ckpt=ckpt)
        for stage in (0, 1, 2, 3)
        for mb in (1, 2, 8)
        for opt in ("none", "cpu")
        for ckpt in (False, True)
        if not (stage == 0 and opt == "cpu")
    ]
    model = CostModel(FACTS, "cpu")
    model.fit([(c, truth.step_time_s(c)) for c in observed])
    for c in observed:
        assert model.step_time_s(c) == pytest.approx(truth.step_time_s(c), rel=0.1)
    assert model.weights["compute_fp32"] > 2.0


def test_this_cpus_matmul_rates_order_the_precisions() -> None:
    """AMX CPUs run bf16 ~5x faster than fp32, AVX2 CPUs ~10x slower: the prior must come
    from the machine, or the model never proposes the faster precision."""
    from autotune.run.cost_model import compute_scale_from, measure_cpu_matmul_flops

    flops = measure_cpu_matmul_flops(("fp32", "bf16"), threads=1)
    assert flops["fp32"] > 1e8 and flops["bf16"] > 1e7
    model = CostModel(FACTS, "cpu", compute_scale=compute_scale_from(flops))
    bf16, fp32 = model.terms(cand(precision="bf16")), model.terms(cand())
    ratio = fp32["compute_fp32"] / bf16["compute_bf16"]
    assert ratio == pytest.approx(flops["bf16"] / flops["fp32"], rel=1e-6)
    # a machine where bf16 is 5x faster: the model ranks bf16 first before any probe
    fast_bf16 = CostModel(FACTS, "cpu", compute_scale=compute_scale_from({"fp32": 1, "bf16": 5}))
    big = CostModel(WorkloadFacts(params=100_000_000, tokens_per_sample=64), "cpu")
    big.compute_scale = fast_bf16.compute_scale
    assert big.samples_per_s(cand(precision="bf16")) > big.samples_per_s(cand())


def test_an_unmeasured_precision_learns_from_the_measured_ones() -> None:
    model = CostModel(FACTS, "cpu")
    slow = [(cand(mb=mb), 3.0 * CostModel(FACTS, "cpu").step_time_s(cand(mb=mb))) for mb in (1, 8)]
    model.fit(slow)
    assert model.weights["compute_fp32"] > 1.5
    assert model.weights["compute_bf16"] == pytest.approx(model.weights["compute_fp32"])


def test_the_leave_one_out_error_is_what_the_model_misses_on_a_probe_it_did_not_see() -> None:
    """Times the model's own terms make exactly: no error; one probe 30% off what the
    others imply: it alone is missed by about that much, so the median stays small; every
    probe off by its own amount: the median error is theirs. Below three probes: None."""
    from autotune.run.cost_model import MIN_PROBES_FOR_ERROR

    truth = CostModel(FACTS, "cpu")
    observed = [cand(stage, mb=mb) for stage in (0, 1, 2) for mb in (1, 2, 8)]
    exact = [(c, truth.step_time_s(c)) for c in observed]
    model = CostModel(FACTS, "cpu")
    assert model.leave_one_out_error(exact) == pytest.approx(0.0, abs=1e-6)
    assert model.weights == pytest.approx(dict.fromkeys(TERMS, 1.0), abs=1e-6)  # fitted on all
    one_off = [*exact[:4], (exact[4][0], 1.3 * exact[4][1]), *exact[5:]]
    assert model.leave_one_out_error(one_off) < 0.05
    scatter = [1.0, 1.2, 0.8, 1.15, 0.85, 1.1, 0.9, 1.25, 0.75]
    noisy = [(c, f * t) for (c, t), f in zip(exact, scatter, strict=True)]
    assert 0.08 < model.leave_one_out_error(noisy) < 0.3
    assert model.leave_one_out_error(exact[: MIN_PROBES_FOR_ERROR - 1]) is None


# -- policy and sampler --------------------------------------------------------------------
def bound_space():
    return load_space("default").bind(CPU, data_parallel_size=2, global_batch=16)


def test_history_is_monotonic_in_the_micro_batch() -> None:
    history = History()
    history.add(cand(mb=4), "oom", None)
    history.add(cand(mb=1), "ok", 1.0)
    assert history.known_not_to_fit(cand(mb=8)) and history.known_not_to_fit(cand(mb=4))
    assert not history.known_not_to_fit(cand(mb=2)) and not history.known_not_to_fit(cand(3))
    assert history.known_to_fit(cand(mb=1)) and not history.known_to_fit(cand(mb=2))
    assert shape_key(cand(mb=1)) == shape_key(cand(mb=8))


def test_grid_policy_proposes_every_candidate_once() -> None:
    space = bound_space()
    candidates = list(space.candidates())
    policy = CandidatePolicy(candidates, cost=None, mode="grid")
    history, seen = History(), []
    while (pick := policy.choose(history)) is not None:
        seen.append(pick.key)
        history.add(pick, "ok", 1.0)
    assert seen == [c.key for c in candidates]


def test_model_policy_skips_what_cannot_fit_and_explores() -> None:
    space = bound_space()
    candidates = list(space.candidates())
    policy = CandidatePolicy(
        candidates,
        cost=CostModel(FACTS, "cpu"),
        may_fit=lambda c: c.zero_stage != 1,  # say ZeRO-1 never fits
        mode="model",
    )
    history, stages = History(), set()
    for _ in range(12):
        pick = policy.choose(history)
        assert pick is not None and pick.zero_stage != 1 and pick.key not in history.evaluated
        stages.add(pick.zero_stage)
        history.add(pick, "ok", 0.2)
    assert stages >= {0, 2, 3}  # unmeasured stages earn the exploration bonus


def test_every_stage_that_may_fit_is_probed_once_first() -> None:
    """Even when the cost model ranks a stage far last (here ZeRO-0 at a fifth of the
    others, more than any novelty bonus makes up), it is probed among the first, one probe
    per stage; a stage that cannot fit is not proposed, and a failed probe covers its stage
    (it is not retried for coverage)."""

    class ZeroZeroLast(CostModel):
        def fit(self, measured) -> None:  # keep the bias through the probes
            pass

        def samples_per_s(self, candidate: Candidate) -> float:
            slower = 0.2 if candidate.zero_stage == 0 else 1.0
            return super().samples_per_s(candidate) * slower

    candidates = list(bound_space().candidates())
    policy = CandidatePolicy(
        candidates, cost=ZeroZeroLast(FACTS, "cpu"), may_fit=lambda c: c.zero_stage != 1
    )
    history, picks = History(), []
    for status in ("error", "ok", "ok", "ok"):
        pick = policy.choose(history)
        assert pick is not None
        picks.append(pick)
        history.add(pick, status, 0.2 if status == "ok" else None)
    assert sorted(p.zero_stage for p in picks[:3]) == [0, 2, 3]
    assert picks[3].zero_stage != 0  # covered: back to the model's order


def test_a_candidate_is_promising_while_its_prediction_is_near_the_best_measured() -> None:
    """:meth:`CandidatePolicy.promising`: some open candidate predicted within
    PROMISING_MARGIN of the best measured score; always before a measurement, under the grid,
    and never with nothing open."""
    from autotune.run.sampler import PROMISING_MARGIN

    candidates = [cand(stage=2, mb=mb) for mb in (1, 2, 4, 8)]
    cost = CostModel(FACTS, "cpu")
    policy = CandidatePolicy(candidates, cost=cost, mode="model")
    history = History()
    assert policy.promising(history, (0, 1e9))  # nothing measured: everything is
    history.add(candidates[3], "ok", 0.5)
    cost.fit(history.measured)
    predicted = max(cost.samples_per_s(c) for c in candidates[:3])
    assert policy.promising(history, (0, predicted))
    assert policy.promising(history, (0, predicted / (1 - PROMISING_MARGIN) * 0.999))
    assert not policy.promising(history, (0, predicted / (1 - PROMISING_MARGIN) * 1.001))
    assert policy.promising(history, (-1, 10 * predicted))  # a lower tier: anything beats it
    grid = CandidatePolicy(candidates, cost=cost, mode="grid")
    assert grid.promising(history, (0, 10 * predicted))
    for candidate in candidates[:3]:
        history.add(candidate, "ok", 0.5)
    assert not policy.promising(history, (0, 1.0))  # nothing left open


def test_settling_says_how_far_the_nearest_open_candidate_is_and_the_models_error() -> None:
    """:meth:`CandidatePolicy.settling`: the best open prediction's share below the best,
    and the cost model's leave-one-out error once three probes are measured."""
    candidates = [cand(stage=2, mb=mb) for mb in (1, 2, 4, 8)]
    cost = CostModel(FACTS, "cpu")
    policy = CandidatePolicy(candidates, cost=cost, mode="model")
    history = History()
    history.add(candidates[3], "ok", 0.5)
    settling = policy.settling(history, (0, 1e9))
    assert settling.model_error is None and settling.probes == 1
    predicted = max(cost.samples_per_s(c) for c in candidates[:3])
    assert settling.gap == pytest.approx(1.0 - predicted / 1e9)
    history.add(candidates[2], "ok", 0.3)
    history.add(candidates[1], "ok", 0.2)
    settling = policy.settling(history, (0, 1e9))
    assert settling.probes == 3 and settling.model_error is not None
    assert settling.model_error == pytest.approx(cost.leave_one_out_error(history.measured))
    assert policy.settling(history, (1, 1e9)).gap is None  # no open candidate of that tier


def test_sampler_drives_an_optuna_study_with_whole_candidates() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space = bound_space()
    policy = CandidatePolicy(list(space.candidates()), cost=CostModel(FACTS, "cpu"))
    study = optuna.create_study(direction="maximize", sampler=CandidateSampler(space, policy))
    keys = []
    for _ in range(8):
        trial = study.ask()
        candidate = space.suggest(trial)
        trial.set_user_attr("candidate", candidate.model_dump(mode="json"))
        trial.set_user_attr("status", "ok")
        trial.set_user_attr("step_time_s", 0.1 * (1 + candidate.zero_stage))
        keys.append(candidate.key)
        study.tell(trial, 16 / (0.1 * (1 + candidate.zero_stage)))
    assert len(set(keys)) == 8  # never a duplicate
    # an enqueued trial (a retry) still gets exactly its parameters
    fixed = space.params_of(next(space.candidates()))
    study.enqueue_trial(fixed)
    trial = study.ask()
    assert space.suggest(trial) == next(space.candidates())


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("autotune", "CandidateSampler"),
        ("grid", "CandidateSampler"),
        ("tpe", "TPESampler"),
        ("gp", "GPSampler"),
        ("random", "RandomSampler"),
    ],
)
def test_sampler_flag_selects_the_sampler(name: str, kind: str, tmp_path) -> None:
    from autotune.run._resolved_run import resolve_run
    from autotune.run._tuner import Tuner
    from autotune.settings import RunSettings

    settings = RunSettings.build(
        workload="gpt-tiny", world_sizes=(2,), sampler=name, trials_dir=tmp_path / "trials"
    )
    sampler, policy = Tuner(resolve_run(settings)).make_sampler()
    assert type(sampler).__name__ == kind
    assert (policy is None) == (kind != "CandidateSampler")
    if name == "grid":
        assert policy is sampler.policy and policy.mode == "grid" and policy.cost is None


def test_under_a_cost_objective_the_policy_proposes_by_samples_per_s_per_gpu() -> None:
    """Two world sizes of one configuration, the larger predicted faster but with less per
    GPU: throughput proposes the larger first, cost the smaller."""
    from autotune.training_goal import TrainingGoal

    class Scaling(CostModel):
        def fit(self, measured) -> None:
            pass

        def samples_per_s(self, candidate: Candidate) -> float:
            return {1: 100.0, 2: 160.0}[candidate.data_parallel_size]

    one, two = (
        Candidate(
            precision="fp32",
            zero_stage=0,
            micro_batch_size=4,
            gradient_accumulation_steps=2 // ranks,
            data_parallel_size=ranks,
        )
        for ranks in (1, 2)
    )
    model = Scaling(FACTS, "cpu")
    fastest = CandidatePolicy([one, two], cost=model).choose(History())
    cheapest = CandidatePolicy(
        [one, two], cost=model, goal=TrainingGoal.of("cost", gpu_hour_price_usd=1.0)
    ).choose(History())
    assert (fastest, cheapest) == (two, one)
