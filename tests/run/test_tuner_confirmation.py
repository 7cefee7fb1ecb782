"""The tuner's confirmation round and stage coverage, with scripted probes: tie rounds, the
first probe of each ZeRO stage, one winner in the export, status and the dashboard."""

from __future__ import annotations

import pytest

from autotune.run.budget import MAX_RESERVE_SHARE
from autotune.study import best, records
from autotune.study import confirmation as confirm
from tests.support.cli import run_cli
from tests.support.scripted import ScriptedExecutor, load_study, make_tuner
from tests.support.studies import study_with

THREE_STAGES = (  # z0, z1 and z2 at fp32 mb8x1, nothing else
    "precision: [fp32]\nzero_stage: [0, 1, 2]\noffload_optimizer: [none]\n"
    "offload_param: [none]\nmicro_batch_size: [8]\ngradient_accumulation_steps: [1]\n"
    "activation_checkpointing: [false]\n"
)


@pytest.mark.parametrize("tied", [True, False])
def test_a_tie_between_the_best_two_gets_more_rounds_of_those_two(tmp_path, tied) -> None:
    from autotune.study import confirmation as confirm

    # z0 and z1 alternate around 100 and 97 (a tie that never separates); z2 is far behind
    close = [100.0] + [92.0, 108.0] * 30
    rival = [97.0] + [89.0, 105.0] * 30
    rival = rival if tied else [60.0, 61.0, 60.5, 60.2]
    scripted = ScriptedExecutor(
        {"z0 fp32 mb8x1": close, "z1 fp32 mb8x1": rival, "z2 fp32 mb8x1": [50.0, 50.5, 49.5]}
    )
    tuner = make_tuner(
        tmp_path,
        THREE_STAGES,
        scripted,
        budget_s=600,
        early_stop=False,
    )
    run = tuner.run()
    verdict = confirm.load(load_study(tmp_path))
    assert verdict is not None and run.confirmation == verdict  # the run returns it typed
    confirmation_probes = scripted.order[3:]
    # two rounds of all three; z2 then is out of the winner's noise and leaves the race
    assert "z2 fp32 mb8x1" not in confirmation_probes[6:]
    if tied:
        # the budget has room: every round the plan holds, of the best two only
        rounds = confirm.ROUNDS + confirm.TIE_ROUNDS
        assert verdict.rounds == rounds and verdict.tie_rounds == 0 and verdict.tie
        extra = confirmation_probes[3 + 3 :]
        assert len(extra) == 2 * (rounds - 2) and "z2 fp32 mb8x1" not in extra
        summary = (tmp_path / "trials" / "gpt-tiny" / "best" / "summary.md").read_text()
        assert f"interleaved, in {rounds} round(s);" in summary
        z2 = next(c.trial for c in verdict.contenders if c.label == "z2 fp32 mb8x1")
        assert verdict.left_race == [z2]
        assert f"trial(s) {z2} left the rounds early, out of the winner's noise" in summary
    else:
        # z1 leaves the race with z2: the winner stands apart after two rounds
        assert verdict.rounds == 2 and verdict.tie_rounds == 0 and not verdict.tie
        assert len(confirmation_probes) == 3 * 2
    study = load_study(tmp_path)
    assert study.trials[verdict.winner].user_attrs["label"] == "z0 fp32 mb8x1"


def test_a_round_stops_where_a_slow_probe_leaves_no_time_for_the_next(tmp_path) -> None:
    """The round starts only with time for all of it at the search's probe time; a re-probe
    that takes far longer (a machine suddenly loaded) ends it there, so the run keeps its
    budget instead of finishing the round past it."""
    import time

    budget_s = 20.0
    scripted = ScriptedExecutor(
        {"z0 fp32 mb8x1": [100.0], "z1 fp32 mb8x1": [99.0], "z2 fp32 mb8x1": [98.0]},
        seconds={("z1 fp32 mb8x1", 2): budget_s},  # its first re-probe
    )
    tuner = make_tuner(
        tmp_path,
        THREE_STAGES,
        scripted,
        budget_s=budget_s,
        early_stop=False,
    )
    started = time.monotonic()
    run = tuner.run()
    assert sorted(scripted.order[:3]) == ["z0 fp32 mb8x1", "z1 fp32 mb8x1", "z2 fp32 mb8x1"]
    # the round began (z0, then the slow z1) and stopped before z2's re-probe
    assert scripted.order[3:] == ["z0 fp32 mb8x1", "z1 fp32 mb8x1"]
    assert run.confirmation is not None and run.confirmation.rounds == 0
    assert time.monotonic() - started < 2 * budget_s


def test_a_stages_first_probe_is_never_stopped_early(tmp_path) -> None:
    """Stage coverage gives each ZeRO stage one probe before the rest; that probe is the
    stage's only evidence, so it runs in full whatever the best so far."""
    rates = {
        f"z{z} fp32 mb{m}x{8 // m}": [100.0 / (1 + z + 8 // m)] for z in (0, 1) for m in (2, 4, 8)
    }
    scripted = ScriptedExecutor(rates)
    tuner = make_tuner(
        tmp_path,
        "precision: [fp32]\nzero_stage: [0, 1]\noffload_optimizer: [none]\n"
        "offload_param: [none]\nmicro_batch_size: [2, 4, 8]\n"
        "activation_checkpointing: [false]\n",
        scripted,
        global_batch=16,
        budget_s=600,
        confirm=False,
    )
    tuner.run()
    assert len(scripted.order) == 6
    first_of_stage = {}
    for label, threshold in zip(scripted.order, scripted.stop_below, strict=True):
        first_of_stage.setdefault(label[:2], threshold)
    assert first_of_stage == {"z0": 0.0, "z1": 0.0}
    assert any(threshold > 0 for threshold in scripted.stop_below)  # the others may stop


def test_stage_coverage_decides_when_the_reserve_starts(tmp_path) -> None:
    """On a short budget the reserve would end the search after two configs; it waits for
    autotune's least search, one probe of every ZeRO stage that may fit."""
    from autotune.candidate import Candidate
    from autotune.run.sampler import History

    tuner = make_tuner(
        tmp_path,
        "precision: [fp32]\nzero_stage: [0, 1]\noffload_optimizer: [none]\n"
        "offload_param: [none]\nmicro_batch_size: [4, 8]\nactivation_checkpointing: [false]\n",
        global_batch=16,
    )
    _, policy = tuner.make_sampler()
    assert policy is not None

    def candidate(stage: int, micro_batch: int) -> dict[str, object]:
        return Candidate(
            precision="fp32",
            zero_stage=stage,
            micro_batch_size=micro_batch,
            gradient_accumulation_steps=8 // micro_batch,
            data_parallel_size=2,
        ).model_dump(mode="json")

    # two feasible ZeRO-1 configs, ZeRO-0 not probed yet
    study = study_with({"a": [0.2, 0.2, 0.2]}, probe_wall_s=3.0, candidate=candidate(1, 8))
    study.add_trial(
        study_with({"b": [0.3, 0.3, 0.3]}, probe_wall_s=3.0, candidate=candidate(1, 4)).trials[0]
    )
    assert not policy.covered(History.of(records.views(study)))
    study.add_trial(
        study_with({"c": [0.4, 0.4, 0.4]}, probe_wall_s=3.0, candidate=candidate(0, 4)).trials[0]
    )
    assert policy.covered(History.of(records.views(study)))


@pytest.mark.parametrize("budget_s", [20.0, 600.0])
def test_on_a_short_budget_the_search_settles_and_the_round_gets_the_rest(
    tmp_path, budget_s
) -> None:
    """After stage coverage the other candidates (micro-batches 1 and 2, predicted far below
    the two measured) are not promising. On a budget short of the round's plan the search
    ends there ("settled") and the round gets what is left; on one that holds the plan the
    search goes on and probes them (the cost model is rough)."""
    from autotune.cli._render import line
    from autotune.run.sampler import History

    tied = [100.0] + [92.0, 108.0] * 30  # around 100 and 97: a tie that never separates
    rates = {"z0 fp32 mb8x2": tied, "z1 fp32 mb8x2": [x - 3 for x in tied]}
    rates.update({f"z{z} fp32 mb{m}x{16 // m}": [40.0] for z in (0, 1) for m in (1, 2)})
    scripted = ScriptedExecutor(rates)
    tuner = make_tuner(
        tmp_path,
        "precision: [fp32]\nzero_stage: [0, 1]\noffload_optimizer: [none]\n"
        "offload_param: [none]\nmicro_batch_size: [1, 2, 8]\nactivation_checkpointing: [false]\n",
        scripted,
        global_batch=32,
        budget_s=budget_s,
        early_stop=False,
    )
    run = tuner.run()
    assert run.stop is not None
    search_probes = 2 if budget_s == 20.0 else 6
    assert sorted(scripted.order[:2]) == ["z0 fp32 mb8x2", "z1 fp32 mb8x2"]
    assert len(set(scripted.order)) == search_probes
    study = load_study(tmp_path)
    _, policy = tuner.make_sampler()
    assert policy is not None
    two = History.of(records.views(study)[:2])  # the study as the coverage probes left it
    assert not policy.promising(two, (0, 100.0)), "the test needs an unpromising rest"
    verdict = confirm.load(study)
    # the two never separate: every round the plan holds
    assert verdict is not None and verdict.rounds == confirm.ROUNDS + confirm.TIE_ROUNDS
    if budget_s == 20.0:
        assert run.stop.kind == "settled"
        # the rest went to the round: more re-probes (1 s each) than its capped share holds
        assert len(scripted.order) - 2 > MAX_RESERVE_SHARE * budget_s
        # two probes: too few for the model's leave-one-out error, so the line gives the gap
        assert run.stop.model_error is None and run.stop.probes == 2
        assert run.stop.predicted_gap is not None and run.stop.predicted_gap > 0.05
        assert line(run.stop).startswith(
            "search stopped: no open candidate is predicted within 5% of the best (the "
            f"nearest {100 * run.stop.predicted_gap:.0f}% below it), and the budget is short "
            "of the confirmation round's plan: its last "
        )
    else:
        assert run.stop.kind == "exhausted"
    assert study.trials[verdict.winner].user_attrs["label"] == "z0 fp32 mb8x2"


def test_one_winner_everywhere_when_the_confirmed_winner_is_not_the_raw_maximum(
    tmp_path,
) -> None:
    """The search's fastest single measurement (z1, a lucky 110) loses the confirmation to
    z0: the run's export, ``autotune export``, ``autotune status``'s ``*`` and the study's
    ``autotune_best`` (what optuna-dashboard shows) all name z0, and no re-probe is a trial
    of its own, so none can pose as a better trial in the dashboard."""
    import json

    scripted = ScriptedExecutor(
        {
            "z0 fp32 mb8x1": [100.0, 104.0, 106.0, 105.0, 104.0, 106.0, 105.0],
            "z1 fp32 mb8x1": [110.0, 90.0, 91.0, 89.0, 90.0, 91.0, 89.0],
            "z2 fp32 mb8x1": [50.0, 50.5, 49.5],
        }
    )
    tuner = make_tuner(
        tmp_path,
        THREE_STAGES,
        scripted,
        budget_s=600,
        early_stop=False,
    )
    summary = tuner.run()
    study = load_study(tmp_path)
    raw_max = max(study.trials, key=lambda t: t.value or 0.0)
    assert raw_max.user_attrs["label"] == "z1 fp32 mb8x1"
    assert summary.best is not None and summary.best.confirmed
    assert summary.best.label == "z0 fp32 mb8x1"
    assert study.user_attrs[best.BEST_ATTR]["trial"] == summary.best.trial
    assert len(study.trials) == 3  # the re-probes are in the verdict, not trials
    run_config = (tmp_path / "trials" / "gpt-tiny" / "best" / "ds_config.json").read_text()
    storage = f"sqlite:///{tmp_path}/t.db"
    exported = run_cli("export", "-o", "out", "--storage", storage, cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert f"trial {summary.best.trial} (z0 fp32 mb8x1) exported" in exported.stdout
    assert json.loads((tmp_path / "out" / "ds_config.json").read_text()) == json.loads(run_config)
    status = run_cli("status", "--storage", storage, cwd=tmp_path, env={"COLUMNS": "250"})
    rows = [line.split("│") for line in status.stdout.splitlines() if line.count("│") > 2]
    starred = [row for row in rows if "*" in row[1]]
    assert len(starred) == 1 and "z0 fp32 mb8x1" in starred[0][3], status.stdout


TWO_WITHIN_NOISE = (
    "precision: [fp32]\nzero_stage: [0, 1]\noffload_optimizer: [none, cpu]\n"
    "offload_param: [none]\nmicro_batch_size: [8]\ngradient_accumulation_steps: [1]\n"
    "activation_checkpointing: [false]\n"
)


def _offload_against_plain(tmp_path, offload: list[float], plain: list[float]):
    """A study of a CPU-offload config, one without offload and a slow third, each probe's
    samples/s scripted; the exported label, the verdict and summary.md."""
    scripted = ScriptedExecutor(
        {"z1 fp32 mb8x1 opt:cpu": offload, "z0 fp32 mb8x1": plain, "z1 fp32 mb8x1": [120.0]}
    )
    tuner = make_tuner(tmp_path, TWO_WITHIN_NOISE, scripted, budget_s=600, early_stop=False)
    summary = tuner.run()
    assert summary.best is not None
    verdict = confirm.load(load_study(tmp_path))
    assert verdict is not None
    text = (tmp_path / "trials" / "gpt-tiny" / "best" / "summary.md").read_text()
    return summary.best.label, verdict, text


def test_the_tuner_exports_the_steadier_of_two_within_noise(tmp_path) -> None:
    """Scripted probes (a stand-in, by design: real probes cannot be made bimodal on
    demand): a CPU-offload config whose probes land in two modes, 150 and ~212, leads by
    its median; a steady config at ~190 is within its noise (but more than 2% behind, so
    not chosen as the simpler). The steady one is exported, and summary.md says why."""
    # its mean (194) and median (212) both beat the steady 190
    bimodal = [214.0, 150.0, 213.0, 212.0, 152.0, 214.0, 213.0, 150.0, 212.0, 211.0] * 3
    steady = [190.0, 188.0, 192.0, 189.0, 191.0, 190.0, 189.5, 190.5, 191.0, 189.0] * 3
    label, verdict, text = _offload_against_plain(tmp_path, bimodal, steady)
    assert label == "z0 fp32 mb8x1" and verdict.steadier_over is not None
    assert "chose the steadier" in text and "z1 fp32 mb8x1 opt:cpu" in text


def test_the_tuner_exports_the_simpler_of_two_within_noise(tmp_path) -> None:
    """Scripted probes: a CPU-offload config leads by its median, 1.5% ahead of a config
    without offload, within each other's noise through every round the plan holds. The one
    without offload is exported, the rounds after the first go to that pair, and summary.md
    says what makes it simpler."""
    offload = [200.0, 191.0, 209.0, 198.0, 202.0] * 6
    plain = [197.0, 196.0, 199.0, 198.0, 197.0, 195.0, 198.0, 197.0, 196.0, 198.0, 197.0] * 3
    label, verdict, text = _offload_against_plain(tmp_path, offload, plain)
    assert label == "z0 fp32 mb8x1" and verdict.simpler_over is not None
    assert verdict.steadier_over is None and verdict.rounds > confirm.ROUNDS
    counts = {c.label: len(c.samples_per_s) for c in verdict.contenders}
    assert counts["z0 fp32 mb8x1"] == counts["z1 fp32 mb8x1 opt:cpu"] > 4  # the deciding pair
    assert "chose the simpler (no offload)" in text and "z1 fp32 mb8x1 opt:cpu" in text


def test_under_a_cost_objective_the_round_confirms_the_cheapest_world_size(tmp_path) -> None:
    """Two world sizes of one configuration: 2 ranks faster, 1 rank cheaper per GPU. The
    second probe's early stop asks what matches the first per GPU; the round ranks per GPU;
    the export launches 1 rank."""
    from autotune.training_goal import TrainingGoal

    scripted = ScriptedExecutor(
        {"z0 fp32 mb8x2": [100.0, 101.0, 99.0, 100.5], "z0 fp32 mb8x1": [160.0, 162.0, 158.0]}
    )
    tuner = make_tuner(
        tmp_path,
        "precision: [fp32]\nzero_stage: [0]\noffload_optimizer: [none]\noffload_param: [none]\n"
        "micro_batch_size: [8]\nactivation_checkpointing: [false]\n",
        scripted,
        world_sizes=(1, 2),
        global_batch=16,
        budget_s=600,
        goal=TrainingGoal.of("cost", gpu_hour_price_usd=2.0),
    )
    run = tuner.run()
    verdict = confirm.load(load_study(tmp_path))
    assert verdict is not None and verdict.goal is not None and verdict.goal.objective == "cost"
    assert sorted(c.gpus for c in verdict.contenders) == [1, 2]
    winner = next(c for c in verdict.contenders if c.trial == verdict.winner)
    assert winner.gpus == 1 and run.best is not None and run.best.trial == verdict.winner
    first, second = scripted.order[:2]
    per_gpu = {"z0 fp32 mb8x2": 100.0, "z0 fp32 mb8x1": 80.0}[first]
    gpus_second = {"z0 fp32 mb8x2": 1, "z0 fp32 mb8x1": 2}[second]
    assert scripted.stop_below[1] == pytest.approx(per_gpu * gpus_second * 0.95)
    launch = (tmp_path / "trials" / "gpt-tiny" / "best" / "launch.sh").read_text()
    assert "--nproc-per-node=1" in launch


def _rounds_on_a_fake_clock(study, wall_s: dict[str, float], rate, keep_s: float = 0.0):
    """:class:`ConfirmationRounds` on ``study``'s contenders with 10 s of probing left (a
    15 s budget, 5 s for the finish) on a clock that each re-probe of label L advances by
    ``wall_s[L]``; ``rate(n)`` is the n-th re-probe's samples/s. Returns the verdict, the
    labels re-probed in order and the clock."""
    from types import SimpleNamespace

    from autotune.protocol import ProbeResult
    from autotune.run._confirmation_rounds import ConfirmationRounds
    from autotune.run.budget import BudgetClock, BudgetRecord

    now = [0.0]
    clock = BudgetClock(BudgetRecord(total_s=15.0, finish_s=5.0), None, clock=lambda: now[0])
    clock.start()
    submitted: list[str] = []

    def submit(candidate, record, *, trial, folder):
        submitted.append(record.label)
        return SimpleNamespace(record=SimpleNamespace(trial_dir=folder))

    def wait_for(job) -> ProbeResult:
        seconds = wall_s[submitted[-1]]
        now[0] += seconds
        value = rate(len(submitted))
        return ProbeResult(
            status="ok",
            samples_per_s=value,
            step_time_s=16 / value,
            wall_s=seconds,
            cold_start=False,
        )

    verdict = ConfirmationRounds(
        study=study,
        dispatcher=SimpleNamespace(submit=submit),  # type: ignore[arg-type]
        clock=clock,
        vram_limit_bytes=0,
        stopping=lambda: False,
        wait_for=wait_for,
        emit=lambda event: None,
        keep_s=keep_s,
    ).run()
    return verdict, submitted, clock


@pytest.mark.parametrize("keep_s", [0.0, 6.0])
def test_the_round_leaves_the_loss_checks_time_alone(keep_s) -> None:
    """The round probes while the time left, less ``keep_s`` (what the search held for the
    loss check, ``--verify``), holds a whole round: 10 s left at 1 s a probe is five rounds
    of two contenders; with 6 s kept, two."""
    study = study_with({"a": [0.2, 0.3, 0.25], "b": [0.21, 0.31, 0.26]}, probe_wall_s=1.0)
    verdict, submitted, clock = _rounds_on_a_fake_clock(
        study,
        {"a": 1.0, "b": 1.0},
        lambda n: 70.0 if n // 2 % 2 else 60.0,  # both alike: a tie to the end
        keep_s=keep_s,
    )
    assert verdict is not None
    assert len(submitted) == (10 if keep_s == 0.0 else 4)
    assert clock.probing_left_s >= keep_s


def test_a_round_is_timed_by_each_contenders_own_probe_time() -> None:
    """A contender whose probes take 9 s (offload, a small micro-batch) beside two of 1 s:
    with 10 s left a round of all three (11 s) does not fit, whatever the median probe
    time says; the best two get the time, and the run ends within its budget."""
    study = study_with({"a": [0.2, 0.21, 0.2]}, probe_wall_s=1.0)
    study.add_trial(study_with({"b": [0.21, 0.22, 0.21]}, probe_wall_s=1.0).trials[0])
    study.add_trial(study_with({"c": [0.22, 0.23, 0.22]}, probe_wall_s=9.0).trials[0])
    verdict, submitted, clock = _rounds_on_a_fake_clock(
        study, {"a": 1.0, "b": 1.0, "c": 9.0}, lambda n: 80.0
    )
    assert verdict is not None and len(verdict.contenders) == 3
    assert "c" not in submitted and submitted[:2] == ["a", "b"]
    assert clock.probing_left_s >= 0
