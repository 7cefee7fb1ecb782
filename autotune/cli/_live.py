"""The live view of ``autotune run`` on a terminal: where the run stands, redrawn in place.

:class:`RunState` folds the run's events (:mod:`autotune.events`) into what a person wants to
see at a glance: the budget used and left, the probes done, running, infeasible, stopped
early or left out by the memory model, what is being probed now, the best so far with its
interval, and the confirmation round's standings while it runs. :class:`LiveView` draws it
with rich's ``Live`` and prints each event's plain line (:mod:`autotune.cli._render`) above the
panel, so the scroll-back still holds the whole log. Pipes, CI logs and ``--quiet`` get the
plain lines alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import singledispatchmethod
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from autotune import events
from autotune.cli._render import line, stop_reason
from autotune.units import format_duration

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

    from autotune.study import Best


@dataclass
class Running:
    """A probe in flight."""

    who: str  # "trial 7" or "confirmation"
    label: str
    step: str
    since: float
    progress: str = ""  # e.g. "timed step 4", from the probe's rank 0


@dataclass
class Leader:
    """The best configuration so far and the estimate it rests on."""

    trial: int
    label: str
    samples_per_s: float
    half_width: float
    basis: str  # "one probe", "confirmed estimate over 8 probes", ...


@dataclass
class RunState:
    """What the events of one run have said so far (no drawing, no I/O)."""

    now: Callable[[], float] = time.monotonic
    phase: str = "setting up"
    study_name: str = ""
    valid_candidates: int = 0
    evaluated_before: int = 0
    total_s: float = 0.0
    spent_s: float = 0.0
    spent_at: float | None = None  # when spent_s was true; None while the clock is stopped
    reserve_s: float = 0.0
    verify_s: float = 0.0  # of reserve_s, what is held for the loss check
    probe_estimate_s: float = 0.0
    finish_s: float = 0.0
    done: int = 0
    infeasible: int = 0
    stopped_early: int = 0
    failed: int = 0
    ruled_out: int = 0  # judged infeasible without a probe (memory model, a smaller OOM)
    screened: int = 0  # never proposed: the memory model rules them out
    confirmation_probes: int = 0
    running: dict[str, Running] = field(default_factory=dict)
    best: Leader | None = None
    standings: list[events.Standing] = field(default_factory=list)
    stop: str = ""

    @property
    def spent_now_s(self) -> float:
        """The study's spent time now: the last reading plus the time since, if running."""
        if self.spent_at is None:
            return self.spent_s
        return self.spent_s + self.now() - self.spent_at

    def seed_best(self, best: Best | None) -> None:
        """The study's best before this run (a continued study)."""
        if best is not None:
            basis = f"confirmed over {best.probes} probes" if best.confirmed else "one probe"
            self.best = Leader(
                best.trial, best.label, best.samples_per_s, best.half_width, basis + ", earlier"
            )

    @singledispatchmethod
    def apply(self, event: events.Event) -> None:
        """Fold ``event`` into the state (events without a bearing on it are ignored)."""

    @apply.register
    def _(self, event: events.RunStarted) -> None:
        self.phase = "searching"
        self.study_name = event.study_name
        self.valid_candidates = event.valid_candidates
        self.evaluated_before = event.evaluated_before
        self.total_s = event.budget_total_s
        self.spent_s = event.spent_before_s

    @apply.register
    def _(self, event: events.CandidatesScreened) -> None:
        self.screened = event.screened

    @apply.register
    def _(self, event: events.BudgetUpdated) -> None:
        self.total_s = event.total_s
        self.reserve_s = event.reserve_s
        self.verify_s = event.verify_s
        self.probe_estimate_s = event.probe_estimate_s
        self.finish_s = event.finish_s
        self.spent_s = event.spent_s
        if self.spent_at is not None:
            self.spent_at = self.now()

    def _clock_runs(self) -> None:
        # the panel's clock ticks from the first probe; BudgetUpdated brings the set-up
        if self.spent_at is None and self.phase != "done":
            self.spent_at = self.now()

    @apply.register
    def _(self, event: events.ProbeStarted) -> None:
        self._clock_runs()
        who = "confirmation" if event.trial is None else f"trial {event.trial}"
        step = "" if event.reprobe_of is None else f"re-probe of {event.reprobe_of}"
        self.running[_key(event.trial, event.label)] = Running(who, event.label, step, self.now())

    @apply.register
    def _(self, event: events.ProbeProgress) -> None:
        running = self.running.get(_key(event.trial, event.label))
        if running is not None:
            running.progress = f"{event.phase} step {event.steps}"

    @apply.register
    def _(self, event: events.ProbeFinished) -> None:
        self.running.pop(_key(event.trial, event.label), None)
        result = event.result
        if event.trial is None:
            self.confirmation_probes += 1
            return
        self.done += 1
        over = result.peak_bytes > event.vram_limit_bytes > 0 or bool(event.over_limits)
        if result.status == "oom" or (result.status == "ok" and over):
            self.infeasible += 1
        elif result.status == "ok" and result.stopped_early:
            self.stopped_early += 1
        elif result.status == "ok":
            if self.best is None or result.samples_per_s > self.best.samples_per_s:
                rate = result.samples_per_s
                half = _half_width(rate, result.step_times_s)
                self.best = Leader(event.trial, event.label, rate, half, "one probe")
        else:
            self.failed += 1

    @apply.register
    def _(self, event: events.CandidatePruned) -> None:
        self._clock_runs()
        self.ruled_out += 1

    @apply.register
    def _(self, event: events.SearchStopped) -> None:
        self.stop = stop_reason(event)
        self.phase = "search stopped"

    @apply.register
    def _(self, event: events.ConfirmationStarted) -> None:
        self.phase = f"confirming {len(event.labels)} contenders"

    @apply.register
    def _(self, event: events.ConfirmationProgress) -> None:
        self.standings = list(event.standings)

    @apply.register
    def _(self, event: events.ConfirmationDone) -> None:
        self.phase = "confirmed"
        if self.standings:
            first = self.standings[0]
            basis = f"confirmed estimate over {first.probes} probes"
            self.best = Leader(first.trial, first.label, first.estimate, first.half_width, basis)

    @apply.register
    def _(self, event: events.LossCheckStarted) -> None:
        self.phase = f"checking the loss of trial {event.trial}"

    @apply.register
    def _(self, event: events.LossCheckDone) -> None:
        self.phase = f"loss check: {event.verdict}"

    @apply.register
    def _(self, event: events.LossCheckInterrupted) -> None:
        self.phase = "loss check interrupted: nothing recorded"

    @apply.register
    def _(self, event: events.RunFinished) -> None:
        self.spent_s = self.spent_now_s
        self.spent_at = None
        self.phase = "done"
        self.running.clear()


def _half_width(rate: float, step_times_s: list[float]) -> float:
    """The 95% interval of one probe's samples/s, from its step times (as the confirmation
    round's contenders are picked)."""
    import statistics

    from autotune.timing import mean_interval

    if len(step_times_s) < 2 or rate <= 0:
        return 0.0
    mean, half = mean_interval(step_times_s)
    if half >= mean:
        return 0.0  # too few steps to bound it
    batch = rate * statistics.median(step_times_s)
    return batch / (mean - half) - batch / mean


def _key(trial: int | None, label: str) -> str:
    return f"confirmation {label}" if trial is None else f"trial {trial}"


def draw(state: RunState) -> RenderableType:
    """The panel for ``state``."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    grid.add_row("budget", _budget(state))
    grid.add_row("probes", Text(_counts(state)))
    grid.add_row("", Text(_left_out(state)))
    for probe in state.running.values():
        grid.add_row("now", Text(_running(state, probe)))
    if not state.running and state.stop:
        grid.add_row("search", Text(f"stopped: {state.stop}"))
    best = state.best
    text = "none yet"
    if best is not None:
        interval = f" ±{best.half_width:.1f}" if best.half_width else ""
        text = (
            f"trial {best.trial} {best.label}: {best.samples_per_s:.1f}{interval} samples/s "
            f"({best.basis})"
        )
    grid.add_row("best", Text(text))
    parts: list[RenderableType] = [grid]
    if state.standings:
        parts.append(_standings(state.standings))
    title = f"autotune · study {state.study_name!r} · {state.phase}"
    return Panel(Group(*parts), title=title, title_align="left", border_style="blue")


def _budget(state: RunState) -> RenderableType:
    spent = min(state.spent_now_s, state.total_s) if state.total_s else state.spent_now_s
    left = max(state.total_s - spent, 0.0)
    words = f"{format_duration(spent)} of {format_duration(state.total_s)}, "
    words += f"{format_duration(left)} left"
    if state.phase == "searching":
        held = [
            f"{format_duration(seconds)} kept for {what}"
            for seconds, what in (
                (state.reserve_s - state.verify_s, "the confirmation round"),
                (state.verify_s, "the loss check"),
                (state.finish_s, "the finish"),
            )
            if seconds >= 1
        ]
        if held:
            words += f" ({', '.join(held)})"
    row = Table.grid(padding=(0, 1))
    row.add_column(width=32, no_wrap=True)
    row.add_column()
    row.add_row(ProgressBar(total=max(state.total_s, 1.0), completed=spent, width=32), words)
    return row


def _counts(state: RunState) -> str:
    return (
        f"{state.done} done · "
        f"{sum(1 for r in state.running.values() if r.who != 'confirmation')} running · "
        f"{state.infeasible} infeasible · {state.stopped_early} stopped early · "
        f"{state.failed} failed"
        + (f" · {state.confirmation_probes} confirmation" if state.confirmation_probes else "")
    )


def _left_out(state: RunState) -> str:
    return (
        f"{state.screened} left out by the memory model · {state.ruled_out} ruled out without "
        f"a probe · {state.valid_candidates} valid, {state.evaluated_before} evaluated before"
    )


def _running(state: RunState, probe: Running) -> str:
    took = f"{state.now() - probe.since:.0f} s"
    if state.probe_estimate_s:
        took += f" (a probe takes ~{state.probe_estimate_s:.0f} s)"
    step = f" [{probe.step}]" if probe.step else ""
    progress = f", {probe.progress}" if probe.progress else ""
    return f"{probe.who} {probe.label}{step}: {took}{progress}"


def _standings(standings: list[events.Standing]) -> Table:
    table = Table(title="confirmation round, leader first", title_justify="left", box=None)
    for column, justify in (
        ("#", "right"),
        ("trial", "right"),
        ("candidate", "left"),
        ("samples/s", "right"),
        ("95% ±", "right"),
        ("probes", "right"),
    ):
        table.add_column(column, justify=justify, no_wrap=True)
    for rank, standing in enumerate(standings, start=1):
        table.add_row(
            str(rank),
            str(standing.trial),
            standing.label,
            f"{standing.estimate:.1f}",
            f"{standing.half_width:.1f}" if standing.probes > 1 else "",
            str(standing.probes),
        )
    return table


class LiveView:
    """An ``emit`` for :class:`autotune.run._tuner.Tuner` that keeps :func:`draw`'s panel at the
    bottom of the terminal and prints each event's plain line above it. Use as a context
    manager around the run."""

    def __init__(self, console: Console, *, previous: Best | None = None) -> None:
        from rich.live import Live

        self.state = RunState()
        self.state.seed_best(previous)
        self._live: Live = Live(
            console=console,
            get_renderable=lambda: draw(self.state),
            refresh_per_second=2,
        )

    def __enter__(self) -> LiveView:
        self._live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._live.refresh()
        self._live.stop()

    def __call__(self, event: events.Event) -> None:
        self.state.apply(event)
        text = line(event)
        if text is not None and not isinstance(event, events.ProbeStarted):
            self._live.console.print(text)
        self._live.refresh()
