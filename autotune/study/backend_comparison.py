"""DeepSpeed or FSDP2: the fastest feasible configuration of each training backend a study
measured, side by side in speed and peak memory, whichever wins (status, report.html, the
dashboard's note and summary.md show these lines)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.study.records import TrialView

BACKEND_NAMES = {"deepspeed": "DeepSpeed", "fsdp2": "FSDP2"}


def best_per_backend(trials: list[TrialView]) -> list[TrialView]:
    """The fastest trial of each backend: feasible and measured in full, fastest first;
    after them, for a backend with none, its fastest stopped early as clearly slower (a
    partial measurement within the limit), so that a backend the search left early is
    still compared."""
    full: dict[str, TrialView] = {}
    partial: dict[str, TrialView] = {}
    for trial in trials:
        if trial.feasible:
            held_by = full
        elif _stopped_early_within_limit(trial):
            held_by = partial
        else:
            continue
        held = held_by.get(trial.candidate.backend)
        if held is None or (trial.value or 0.0) > (held.value or 0.0):
            held_by[trial.candidate.backend] = trial
    left_early = [t for backend, t in partial.items() if backend not in full]
    return [*_fastest_first(full.values()), *_fastest_first(left_early)]


def backend_lines(trials: list[TrialView]) -> list[str]:
    """One line per backend measured, where there are two: its fastest configuration, its
    samples/s and peak memory per rank, against the faster backend's."""
    front = best_per_backend(trials)
    if len(front) < 2 or not front[0].feasible:
        return []
    lead = front[0]
    lead_rate, lead_peak = float(lead.value or 0.0), _peak(lead)
    lines = []
    for trial in front:
        rate, peak = float(trial.value or 0.0), _peak(trial)
        name = BACKEND_NAMES.get(trial.candidate.backend, trial.candidate.backend)
        if trial is lead:
            against = "the faster backend"
        else:
            memory = f"{peak / lead_peak:.2f}x its peak" if lead_peak else "its peak unknown"
            against = f"{rate / lead_rate:.0%} of {_name(lead)}'s speed at {memory}"
        measured = "" if trial.feasible else " over its first steps (stopped early, clearly slower)"
        lines.append(
            f"- {name}: {trial.candidate.label} (trial {trial.number}), {rate:.1f} samples/s"
            f"{measured}, peak {format_bytes(peak)} per rank; {against}"
        )
    return lines


def _stopped_early_within_limit(trial: TrialView) -> bool:
    return (
        trial.is_evaluation
        and trial.status == "ok"
        and trial.record.stopped_early
        and trial.record.feasible
        and trial.value is not None
    )


def _fastest_first(trials: Iterable[TrialView]) -> list[TrialView]:
    return sorted(trials, key=lambda t: t.value or 0.0, reverse=True)


def _name(trial: TrialView) -> str:
    return BACKEND_NAMES.get(trial.candidate.backend, trial.candidate.backend)


def _peak(trial: TrialView) -> int:
    return max(trial.record.peak_bytes_per_rank, default=trial.record.peak_bytes)
