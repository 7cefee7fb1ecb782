"""The budget counts the command's wall time: a run's set-up is charged, a one-time build of
DeepSpeed's ops is not. The budget's clock here is a :class:`FakeClock` the tests advance
(the stand-in executors advance it as their probes and close take time)."""

from __future__ import annotations

import optuna
import pytest

from autotune.run import budget
from autotune.run.budget import BudgetClock, BudgetRecord, read_budget
from autotune.study import confirmation as confirm
from autotune.study import records
from tests.support.scripted import ScriptedExecutor
from tests.support.studies import study_with

SPACE = (
    "precision: [fp32]\nzero_stage: [0, 1]\noffload_optimizer: [none]\noffload_param: [none]\n"
    "micro_batch_size: [8]\ngradient_accumulation_steps: [1]\nactivation_checkpointing: [false]\n"
)


class FakeClock:
    """A clock in seconds that moves only when :meth:`advance` moves it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)


def _settings(tmp_path, space: str, **flags):
    """Run settings of a gpt-tiny study in ``tmp_path`` over the space ``space`` (YAML)."""
    from autotune.settings import RunSettings

    (tmp_path / "space.yaml").write_text(space)
    return RunSettings.build(
        workload="gpt-tiny",
        world_sizes=(2,),
        trials_dir=tmp_path / "trials",
        storage_url=f"sqlite:///{tmp_path}/t.db",
        space=str(tmp_path / "space.yaml"),
        **flags,
    )


def test_the_clock_runs_from_its_origin_never_from_the_future() -> None:
    now = FakeClock()
    clock = BudgetClock(BudgetRecord(total_s=100.0, spent_s=10.0), None, clock=now)
    assert clock.elapsed_s == 0.0 and clock.left_s == pytest.approx(90.0)
    clock.start(now() - 30.0)
    assert clock.elapsed_s == pytest.approx(30.0)
    assert clock.spent_s == pytest.approx(40.0)
    now.advance(5.0)
    assert clock.left_s == pytest.approx(55.0)
    later = BudgetClock(BudgetRecord(total_s=100.0), None, clock=now)
    later.start(now() + 50.0)  # an origin not reached yet counts from now
    assert later.elapsed_s == 0.0


@pytest.mark.parametrize("ops_build_s", [0.0, 25.0])
def test_a_runs_set_up_is_charged_and_an_op_build_is_not(tmp_path, monkeypatch, ops_build_s):
    """ScriptedExecutor stands in for the probes (they take no time here): what the study
    spent is the set-up before the tuner started, less the op build."""
    from autotune.run._resolved_run import resolve_run
    from autotune.run._tuner import Tuner

    settings = _settings(tmp_path, SPACE, budget_s=600, max_trials=2, confirm=False)
    scripted = ScriptedExecutor({"z0 fp32 mb8x1": [100.0], "z1 fp32 mb8x1": [90.0]})
    set_up_s = 40.0  # the command started this long before the tuner
    now = FakeClock()
    tuner = Tuner(
        resolve_run(settings),
        executor_factory=lambda resolved: scripted,
        started_s=now() - set_up_s,
        clock=now,
    )

    def built_ops() -> float:
        return ops_build_s  # what a first run's compile of the ops took

    monkeypatch.setattr(tuner, "_prepare_ops", built_ops)
    summary = tuner.run()
    assert summary.export_dir
    study = optuna.load_study(study_name="gpt-tiny", storage=f"sqlite:///{tmp_path}/t.db")
    spent_s = read_budget(study).spent_s
    assert spent_s == pytest.approx(set_up_s - ops_build_s)


def test_probing_leaves_the_finish_its_time_measured_once_a_run_has_one() -> None:
    from autotune.run.budget import DEFAULT_FINISH_S

    fresh = BudgetClock(BudgetRecord(total_s=100.0), None)
    assert fresh.probing_left_s == pytest.approx(100.0 - DEFAULT_FINISH_S)
    assert fresh.record().finish_s is None  # nothing measured: nothing stored
    now = FakeClock()
    measured = BudgetClock(BudgetRecord(total_s=100.0, finish_s=1.5), None, clock=now)
    assert measured.probing_left_s == pytest.approx(98.5)
    measured.start()
    measured.probing_done()
    now.advance(0.3)
    measured.finished()
    assert measured.record().finish_s == pytest.approx(0.3)


class TimedExecutor:
    """Stands in for the probes, by design: the test needs probes and a close of known
    durations, which real probes on a noisy machine do not have. Each probe takes
    ``probe_s``; closing takes ``close_s`` (as closing warm workers and Ray does); both
    pass on ``clock``, the budget's."""

    capacity = 1

    def __init__(self, probe_s: float, close_s: float, clock: FakeClock) -> None:
        self.probe_s, self.close_s = probe_s, close_s
        self.clock = clock
        self.probes = 0
        self._pending: tuple[float, int, object] | None = None

    def submit(self, job) -> int:
        from autotune.protocol import ProbeResult

        candidate = job.spec.candidate
        rate = 100.0 - 5.0 * candidate.zero_stage + candidate.micro_batch_size
        self.probes += 1
        result = ProbeResult(
            status="ok",
            samples_per_s=rate,
            samples_per_s_min=rate,
            samples_per_s_max=rate,
            step_time_s=candidate.train_batch_size / rate,
            step_times_s=[candidate.train_batch_size / rate] * 3,
            peak_bytes_per_rank=[2**20, 2**20],
            wall_s=self.probe_s,
        )
        self._pending = (self.clock() + self.probe_s, self.probes, result)
        return self.probes

    def wait(self, timeout_s: float):
        if self._pending is None:
            self.clock.advance(timeout_s)
            return []
        ready_at, number, result = self._pending
        self.clock.advance(min(ready_at - self.clock(), timeout_s))
        if self.clock() < ready_at:
            return []
        self._pending = None
        return [(number, result)]

    def cancel_all(self) -> None:
        self._pending = None

    def close(self) -> None:
        self.clock.advance(self.close_s)


def test_the_run_ends_within_its_budget_finish_included(tmp_path) -> None:
    """Probes of 1 s and a close of 2 s: probing stops early enough for the close and the
    export to fit in the 14 s budget, and the run stores the finish it measured."""
    from autotune.run._resolved_run import resolve_run
    from autotune.run._tuner import Tuner

    space = SPACE.replace("zero_stage: [0, 1]", "zero_stage: [0, 1, 2, 3]").replace(
        "micro_batch_size: [8]", "micro_batch_size: [1, 2, 4, 8]"
    )
    budget_s, close_s = 14.0, 2.0
    settings = _settings(tmp_path, space, budget_s=budget_s, confirm=False)
    now = FakeClock()
    timed = TimedExecutor(probe_s=1.0, close_s=close_s, clock=now)
    started_s = now()
    tuner = Tuner(
        resolve_run(settings),
        executor_factory=lambda resolved: timed,
        started_s=started_s,
        clock=now,
    )
    tuner._prepare_ops = lambda: 0.0  # type: ignore[method-assign]  # ops: not this test's
    summary = tuner.run()
    wall_s = now() - started_s
    assert summary.export_dir and timed.probes >= 3
    assert timed.probes < 16, "the space ran out before the budget: the test checks nothing"
    assert wall_s <= budget_s, f"the run took {wall_s:.1f} s of a {budget_s:.0f} s budget"
    study = optuna.load_study(study_name="gpt-tiny", storage=f"sqlite:///{tmp_path}/t.db")
    assert read_budget(study).finish_s == pytest.approx(close_s)


def _reserve(study: optuna.Study, covered: bool = True) -> float:
    """The reserve the tuner holds for ``study`` (search.Search._update_estimates)."""
    trials = records.views(study)
    ranked = records.ranked_feasible(trials)
    return budget.ReservePolicy().reserve_s(
        budget.SearchState(
            feasible=len(ranked),
            stages_covered=covered,
            contenders=len(confirm.contenders(ranked)),
            full_probe_s=budget.probe_estimate_s(trials, full_only=True),
            probe_s=budget.probe_estimate_s(trials),
            budget_s=3600,
        )
    )


def test_the_reserve_is_timed_by_full_length_probes_for_the_contenders_left() -> None:
    """Confirmation probes never stop early: the reserve is timed by the probes that ran in
    full (an early-stopped probe is a fraction of one), for every contender within noise."""
    # four candidates within noise of each other, each probed in full in 3 s
    study = study_with(
        {
            "a": [0.20, 0.26, 0.16],
            "b": [0.21, 0.27, 0.17],
            "c": [0.21, 0.26, 0.18],
            "d": [0.22, 0.28, 0.17],
        },
        probe_wall_s=3.0,
    )
    # and five probes that stopped early after 0.5 s: they do not time a confirmation probe
    for index in range(5):
        stopped = study.ask()
        attrs = {"label": f"s{index}", "candidate_key": f"s{index}", "probe_wall_s": 0.5}
        attrs["candidate"] = study.trials[0].user_attrs["candidate"]
        for key, value in {**attrs, "status": "ok", "stopped_early": True}.items():
            stopped.set_user_attr(key, value)
        study.tell(stopped, 1.0)
    assert budget.probe_estimate_s(records.views(study)) == 0.5
    assert _reserve(study) == (confirm.ROUNDS * 4 + 2 * confirm.TIE_ROUNDS) * 3.0
    # a warm worker's first probe paid the group's start: once warm probes exist, it is left
    # out of both estimates
    cold = study.ask()
    cold.set_user_attr("candidate", study.trials[0].user_attrs["candidate"])
    for key, value in {"probe_wall_s": 30.0, "status": "ok", "probe_cold_start": True}.items():
        cold.set_user_attr(key, value)
    study.tell(cold, state=optuna.trial.TrialState.FAIL)
    assert budget.probe_estimate_s(records.views(study), full_only=True) == 3.0
    # with one feasible config there is nothing to confirm: no time is held back
    lone = study_with({"a": [0.2, 0.2, 0.2]}, probe_wall_s=3.0)
    assert _reserve(lone) == 0.0
    # nor before every ZeRO stage that may fit has had its probe
    assert _reserve(study, covered=False) == 0.0
    # before any warm probe, the cold ones are all there is
    only_cold = study_with({"a": [0.2, 0.2, 0.2]}, probe_wall_s=30.0, probe_cold_start=True)
    assert budget.probe_estimate_s(records.views(only_cold)) == 30.0


def test_on_a_budget_short_of_the_rounds_plan_the_search_settles_once_nothing_is_promising():
    """The search ends early (:meth:`ReservePolicy.settled`) only where all three hold: the
    round is due, nothing open is promising, and the budget cannot hold the round's plan
    within its share (a long budget keeps searching: the cost model is rough)."""
    plan_s = budget.planned_probes(3) * 2.0  # three contenders at 2 s a full probe
    short, long = plan_s / budget.MAX_RESERVE_SHARE - 1, plan_s / budget.MAX_RESERVE_SHARE
    assert not budget.plan_fits(2.0, 3, short) and budget.plan_fits(2.0, 3, long)

    def settled(
        policy: budget.ReservePolicy | None = None, promising: bool = False, **changed
    ) -> bool:
        facts = dict(feasible=3, stages_covered=True, contenders=3, full_probe_s=2.0)
        facts.update(probe_s=2.0, budget_s=short)
        state = budget.SearchState(**{**facts, **changed})  # type: ignore[arg-type]
        return (policy or budget.ReservePolicy()).settled(state, promising=promising)

    assert settled()
    assert not settled(promising=True)
    assert not settled(budget_s=long)
    assert not settled(stages_covered=False)  # every stage gets its probe first
    assert not settled(feasible=1)  # nothing to confirm yet
    assert not settled(policy=budget.ReservePolicy(enabled=False))  # no round (--no-confirm)
    # a contender more makes the plan longer: the same budget is short of it
    assert budget.plan_fits(2.0, 3, long) and not budget.plan_fits(2.0, 4, long)


def test_the_loss_check_holds_back_one_launch_and_three_runs_of_its_steps() -> None:
    """``run --verify``: once a best exists, one cold launch (the longest probe so far) and
    the reference twice and the best once, each for the check's steps at the slowest
    feasible step time."""
    fast = study_with({"a": [0.2, 0.2]}, probe_wall_s=4.0, step_time_s=0.2)
    slow = study_with({"b": [0.3, 0.3]}, probe_wall_s=9.0, step_time_s=0.3)
    trials = records.views(fast) + records.views(slow)
    assert (budget.longest_probe_s(trials), budget.slowest_step_s(trials)) == (9.0, 0.3)
    policy = budget.ReservePolicy(verify_steps=10)
    held = policy.verify_reserve_s(feasible=2, launch_s=9.0, step_s=0.3)
    assert held == pytest.approx(9.0 + budget.VERIFY_RUNS * 10 * 0.3)
    assert policy.verify_reserve_s(feasible=0, launch_s=9.0, step_s=0.3) == 0.0  # no best yet
    assert budget.ReservePolicy().verify_reserve_s(feasible=2, launch_s=9.0, step_s=0.3) == 0.0
    # at least what an earlier check of the study took (set-up included)
    assert policy.verify_reserve_s(feasible=2, launch_s=9.0, step_s=0.3, checked_s=40.0) == 40.0
    # a script's runs launch one by one, each paying the script's start
    script = budget.ReservePolicy(verify_steps=10, verify_launches=budget.VERIFY_RUNS)
    assert script.verify_reserve_s(feasible=2, launch_s=9.0, step_s=0.3) == pytest.approx(
        budget.VERIFY_RUNS * (9.0 + 10 * 0.3)
    )


def test_reserve_covers_every_contender_and_the_tie_break() -> None:
    tie_break = 2 * confirm.TIE_ROUNDS
    # before the search has contenders: planned for the top three
    assert budget.reserve_s(5.0, 0, 3600) == (3 * 3 + tie_break) * 5.0
    # four contenders within noise: three rounds of all four
    assert budget.reserve_s(5.0, 4, 3600) == (3 * 4 + tie_break) * 5.0
    # never more than MAX_CONTENDERS, never more than 40% of the budget
    assert budget.reserve_s(5.0, 9, 3600) == (3 * confirm.MAX_CONTENDERS + tie_break) * 5.0
    assert budget.reserve_s(100.0, 4, 400) == pytest.approx(0.4 * 400)
