"""The confirmation round on real probes: :func:`autotune.study.confirmation.run_rounds` driven by
the executor's slots.

Re-probes are not trials of the study: a contender's search trial keeps its one
measurement, and every re-probe's samples/s joins the verdict (study user attr
``autotune_confirmation``), which is what decides the best. So optuna-dashboard never shows
a re-probe's lucky value as a trial of its own. Each re-probe keeps its folder,
``trials/<study>/confirm-<trial>-<n>/``, with spec, config, reports and log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune import events, training_goal
from autotune.run.budget import probe_estimate_s
from autotune.study import TrialRecord, ranked_feasible, records
from autotune.study import confirmation as confirm

if TYPE_CHECKING:
    import optuna

    from autotune.protocol import ProbeResult
    from autotune.run._dispatch import Dispatcher, InFlight
    from autotune.run.budget import BudgetClock
    from autotune.study import TrialView


def own_probe_s(trial: TrialView, fallback_s: float) -> float:
    """A contender's probe time: its search probe's wall time when that probe ran in full
    and warm (a cold one paid its process group's start), else ``fallback_s``."""
    wall_s = trial.record.probe_wall_s
    if wall_s is None or trial.record.probe_cold_start or not trial.measured_in_full:
        return fallback_s
    return wall_s


def progress_event(verdict: confirm.Confirmation) -> events.ConfirmationProgress:
    """The standings ``verdict`` would give if it were decided now (on a copy)."""
    current = verdict.model_copy(deep=True)
    current.decide()
    return events.ConfirmationProgress(
        [
            events.Standing(c.trial, c.label, c.estimate, c.half_width, len(c.samples_per_s))
            for c in current.contenders
        ]
    )


def done_event(verdict: confirm.Confirmation) -> events.ConfirmationDone:
    """The decided round as the CLI reports it."""
    return events.ConfirmationDone(verdict.rounds, verdict.seconds, verdict.describe())


@dataclass
class ConfirmationRounds:
    """Probes the search's contenders again, interleaved, on the search's dispatcher, while
    the budget clock has time for a whole round (less ``keep_s``, the loss check's); decides
    and stores the verdict in the study.

    ``wait_for`` blocks until a submitted probe is back (None when the run is stopping
    first); ``stopping`` tells whether the run was interrupted."""

    study: optuna.Study
    dispatcher: Dispatcher
    clock: BudgetClock
    vram_limit_bytes: int
    stopping: Callable[[], bool]
    wait_for: Callable[[InFlight], ProbeResult | None]
    emit: events.Emit
    keep_s: float = 0.0  # held for what runs after the round (the loss check, --verify)

    def run(self) -> confirm.Confirmation | None:
        """The round, decided and stored; None when there is nothing to confirm (fewer than
        two feasible configurations)."""
        trials = records.views(self.study)
        goal = training_goal.of_study(self.study)
        chosen = confirm.contenders(ranked_feasible(trials, goal), goal)
        if len(chosen) < 2:
            return None
        verdict = confirm.Confirmation(
            contenders=[
                confirm.Contender(
                    trial=t.number,
                    label=t.label,
                    gpus=t.candidate.data_parallel_size,
                    samples_per_s=[float(t.value or 0)],
                    moving_parts=list(t.candidate.moving_parts),
                )
                for t in chosen
            ],
            goal=None if goal.ranks_by_speed_alone else goal,
        )
        by_number = {t.number: t for t in chosen}
        by_trial = {c.trial: c for c in verdict.contenders}
        probe_s = probe_estimate_s(trials, full_only=True) or probe_estimate_s(trials)
        # each contender's own probe time: one config can take several times another's
        # (offload, a small micro-batch), and a round timed by the median would overrun
        own_s = {t.number: max(own_probe_s(t, probe_s), 1.0) for t in chosen}
        started = time.monotonic()
        self.emit(events.ConfirmationStarted([t.label for t in chosen]))

        def one_round(numbers: list[int]) -> bool:
            """Each of ``numbers`` once more, in order; False without time for the whole
            round at each contender's own probe time (its latest warm probe's), when the
            run is stopping, or when probes slower than that leave no time for the next one
            (a partial round is not counted)."""
            needed_s = sum(own_s[number] for number in numbers)
            if self.stopping() or self.clock.probing_left_s - self.keep_s < needed_s:
                return False
            for number in numbers:
                if self.clock.probing_left_s - self.keep_s < own_s[number]:
                    return False  # the budget's end would not wait for this probe
                wall_s = self._reprobe(by_number[number], by_trial[number])
                if wall_s is None:
                    return False
                own_s[number] = max(wall_s or own_s[number], 1.0)
                self.emit(progress_event(verdict))
            return True

        confirm.run_rounds(verdict, one_round)
        verdict.seconds = round(time.monotonic() - started, 1)
        verdict.after_trial = max(t.number for t in records.views(self.study))
        confirm.store(self.study, verdict)
        self.emit(done_event(verdict))
        return verdict

    def _reprobe(self, original: TrialView, contender: confirm.Contender) -> float | None:
        """Probe ``original``'s candidate once more; a measured samples/s joins
        ``contender``. Its wall time (0 when it paid a process group's start, which the
        next probe will not); None when the probe was stopped (the run is stopping)."""
        candidate = original.candidate
        record = TrialRecord(
            candidate=candidate,
            candidate_key=candidate.key,
            label=original.label,
            vram_limit_bytes=self.vram_limit_bytes,
        )
        job = self.dispatcher.submit(
            candidate,
            record,
            trial=None,
            folder=f"confirm-{original.number:04d}-{len(contender.samples_per_s)}",
        )
        self.emit(events.ProbeStarted(None, original.label, reprobe_of=original.number))
        result = self.wait_for(job)
        if result is None:
            return None
        self.emit(
            events.ProbeFinished(
                None,
                original.label,
                result,
                self.vram_limit_bytes,
                f"{job.record.trial_dir}/probe.log",
            )
        )
        if result.status == "ok":
            contender.samples_per_s.append(result.samples_per_s)
            contender.step_spreads.append(round(result.spread, 4))
        else:
            contender.failed_probes += 1
        return 0.0 if result.cold_start else result.wall_s
