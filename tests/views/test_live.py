"""The live view of ``autotune run``: what it folds from the events, when it is used, and
the screen of a real run in a terminal (tmux), read back as text."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from autotune import events
from autotune.cli import _app as cli
from autotune.cli._live import LiveView, RunState, draw
from autotune.protocol import ProbeResult
from tests.views.conftest import RealStudy

MIB = 2**20


def _ok(rate: float, *, early: bool = False, peak_mib: int = 30) -> ProbeResult:
    steps = [16 / rate * f for f in (0.98, 1.0, 1.02)]
    return ProbeResult(
        status="ok",
        samples_per_s=rate,
        samples_per_s_min=rate * 0.98,
        samples_per_s_max=rate * 1.02,
        step_times_s=steps,
        peak_bytes_per_rank=[peak_mib * MIB] * 2,
        stopped_early=early,
    )


def _screen(state: RunState) -> str:
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(draw(state))
    return console.export_text()


def test_state_counts_probes_budget_best_and_standings() -> None:
    now = [1000.0]
    state = RunState(now=lambda: now[0])
    limit = 40 * MIB
    for event in (
        events.RunStarted("s", 3, 24, 600.0, 100.0, 500.0, 120.0),
        events.CandidatesScreened(7, 21, limit),
        events.BudgetUpdated(100.0, 600.0, 0.0, 0.0),
        events.ProbeStarted(3, "z0 fp32 mb4x2"),
    ):
        state.apply(event)
    now[0] += 30
    assert state.spent_now_s == pytest.approx(130.0)  # the clock runs from the first probe
    for event in (
        events.ProbeFinished(3, "z0 fp32 mb4x2", _ok(80.0), limit, "log"),
        events.ProbeFinished(4, "z0 fp32 mb8x1", ProbeResult(status="oom", error="x"), limit, ""),
        events.ProbeFinished(5, "z0 fp32 mb1x8", _ok(50.0, early=True), limit, "log"),
        events.ProbeFinished(6, "z0 fp32 mb2x4", _ok(90.0, peak_mib=50), limit, "log"),
        events.ProbeFinished(7, "z1 fp32 mb2x4", ProbeResult(status="error", error="x"), limit, ""),
        events.CandidatePruned(8, "z1 fp32 mb8x1", "predicted over"),
        events.BudgetUpdated(140.0, 600.0, 60.0, 9.0, finish_s=20.0),
        events.ProbeStarted(9, "z0 fp32 mb2x4 ckpt"),
        events.ProbeProgress(9, "z0 fp32 mb2x4 ckpt", "warm-up", 2),
    ):
        state.apply(event)
    assert (state.done, state.infeasible, state.stopped_early, state.failed) == (5, 2, 1, 1)
    assert (state.ruled_out, state.screened, len(state.running)) == (1, 7, 1)
    # over the limit is not a best, however fast; the best has its steps' 95% interval
    assert state.best is not None and state.best.trial == 3 and state.best.half_width > 0
    screen = _screen(state)
    assert (
        "2m20s of 10m, 7m40s left (1m kept for the confirmation round, 20s kept for the finish)"
        in screen
    )
    assert "5 done · 1 running · 2 infeasible · 1 stopped early · 1 failed" in screen
    assert "7 left out by the memory model · 1 ruled out without a probe" in screen
    assert "trial 9 z0 fp32 mb2x4 ckpt: 0 s (a probe takes ~9 s), warm-up step 2" in screen
    assert re.search(r"trial 3 z0 fp32 mb4x2: 80\.0 ±\d+\.\d samples/s", screen)

    state.apply(events.SearchStopped("budget", spent_s=500, total_s=600, reserve_s=60))
    state.apply(events.ConfirmationStarted(["a", "b"]))
    state.apply(events.ProbeStarted(None, "z0 fp32 mb4x2", reprobe_of=3))
    standings = [
        events.Standing(6, "z0 fp32 mb2x4", 88.0, 3.0, 4),
        events.Standing(3, "z0 fp32 mb4x2", 82.0, 2.5, 4),
    ]
    state.apply(events.ConfirmationProgress(standings))
    screen = _screen(state)
    assert "confirming 2 contenders" in screen
    assert "confirmation z0 fp32 mb4x2 [re-probe of 3]" in screen
    assert re.search(r"1\s+6\s+z0 fp32 mb2x4\s+88\.0\s+3\.0\s+4", screen)
    state.apply(events.ConfirmationDone(rounds=3, seconds=100.0, verdict=""))
    state.apply(events.RunFinished(object()))
    screen = _screen(state)
    assert "· done" in screen and "trial 6 z0 fp32 mb2x4: 88.0 ±3.0 samples/s" in screen


def test_the_loss_checks_time_and_progress_are_shown() -> None:
    """``run --verify``: the time held back for the loss check beside the confirmation
    round's, in the panel and in the search's stop line; the check's phase and verdict."""
    from autotune.cli._render import line

    now = [1000.0]
    state = RunState(now=lambda: now[0])
    state.apply(events.RunStarted("s", 0, 4, 600.0, 0.0, 600.0, 120.0))
    state.apply(events.BudgetUpdated(100.0, 600.0, 90.0, 9.0, verify_s=30.0))
    assert "(1m kept for the confirmation round, 30s kept for the loss check)" in _screen(state)
    stopped = events.SearchStopped("budget", spent_s=510, total_s=600, reserve_s=90, verify_s=30)
    assert "kept for the confirmation round and the loss check" in str(line(stopped))
    alone = events.SearchStopped("budget", spent_s=570, total_s=600, reserve_s=30, verify_s=30)
    assert str(line(alone)).endswith("the last 30s kept for the loss check)")
    state.apply(stopped)
    state.apply(events.LossCheckStarted(2, "z2 bf16 mb2x2", "z0 fp32 mb4x1", "why", 10, 3))
    assert "checking the loss of trial 2" in _screen(state)
    state.apply(events.LossCheckDone(2, "drifts within the tolerance of bf16", 1e-3, 0.06, 9))
    assert "loss check: drifts within the tolerance of bf16" in _screen(state)


def test_plain_lines_unless_a_terminal_and_not_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "console", Console(file=io.StringIO(), force_terminal=False))
    with cli._renderer(quiet=False, continued=False, storage="", name="") as emit:
        assert emit is cli._print_event
    terminal = Console(file=io.StringIO(), force_terminal=True)
    monkeypatch.setattr(cli, "console", terminal)
    with cli._renderer(quiet=True, continued=False, storage="", name="") as emit:
        assert emit is cli._print_event
    with cli._renderer(quiet=False, continued=False, storage="", name="") as emit:
        assert isinstance(emit, LiveView)


@pytest.mark.slow
def test_live_view_on_a_terminal(real_study: RealStudy) -> None:
    if not real_study.in_tmux:
        pytest.skip("needs tmux (apt-get install tmux; .ci/run installs it) for a terminal")
    panels = [s for s in real_study.screens if "autotune · study 'gpt-tiny'" in s]
    assert panels, "no live panel on the terminal:\n" + real_study.output
    searching = [s for s in panels if "· searching" in s]
    assert searching, panels[-1]
    # while a probe runs: the budget bar, the counts, the probe, and the best so far
    running = [s for s in searching if re.search(r"now\s+trial \d+ z0 fp32", s)]
    assert running, searching[-1]
    # and how far that probe is, from its rank 0
    assert any(re.search(r"(warm-up|timed) step \d+", s) for s in running), running[-1]
    screen = running[-1]
    assert re.search(r"budget\s+━+", screen) and " left" in screen
    assert re.search(r"probes\s+\d+ done · 1 running · \d+ infeasible", screen)
    assert "left out by the memory model" in screen and "ruled out without a probe" in screen
    assert any(re.search(r"best\s+trial \d+ z0 fp32", s) for s in searching)
    # the panel stays at the bottom while the plain lines scroll above it
    assert any(re.search(r"trial \d+: z0 fp32 \S+( ckpt)? -> ", s) for s in panels)
    final = real_study.output
    assert "· done" in final and "exported:" in final and "report:" in final
    assert final.index("· done") < final.index("exported:")


def test_a_probe_over_host_ram_counts_infeasible_and_is_no_best() -> None:
    state = RunState(now=lambda: 1000.0)
    over = "measured host memory 600.00 MiB on node vm (2 rank(s)) is over --host-ram ..."
    state.apply(events.ProbeFinished(1, "z2 fp32 mb2x2 opt:cpu", _ok(90.0), 40 * MIB, "log"))
    state.apply(
        events.ProbeFinished(2, "z2 fp32 mb4x1 opt:cpu", _ok(99.0), 40 * MIB, "l", over_limits=over)
    )
    assert (state.done, state.infeasible) == (2, 1)
    assert state.best is not None and state.best.trial == 1
