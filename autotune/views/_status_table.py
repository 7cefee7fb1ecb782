"""Text reports of a study: the trials table of ``autotune status``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text

from autotune.study import study_config
from autotune.units import format_bytes

if TYPE_CHECKING:
    import optuna

    from autotune.candidate import Candidate
    from autotune.memory import Planned
    from autotune.space import DroppedBackend
    from autotune.study import best, records


def trials_table(study: optuna.Study) -> Table:
    """One row per evaluated candidate (duplicate proposals are counted in the caption);
    ``*`` marks the best by :func:`autotune.study.best.decide_best`, as every output does."""
    from autotune import training_goal
    from autotune.study import best, records
    from autotune.study import confirmation as confirm
    from autotune.study import loss_checks as checks

    config = study_config(study)
    limit = config.vram_limit_bytes if config else None
    trials = records.views(study)
    duplicates = sum(1 for t in trials if t.record.duplicate_of is not None)
    goal = training_goal.of_study(study)
    decided = best.decide_best(trials, confirm.load(study), checks.set_aside(study), goal)
    table = Table(
        title=f"study {study.study_name}"
        + (
            f": {config.workload}, {config.ranks_text} rank(s), global batch "
            f"{config.global_batch or f'searched (up to {config.max_global_batch})'}"
            if config
            else ""
        ),
        caption=(
            f"{len(trials) - duplicates} evaluated, {duplicates} duplicate proposal(s) not shown; "
            + (f"limit {format_bytes(limit)} per rank; " if limit else "")
            + "* = best"
            + (" (confirmed)" if decided is not None and decided.confirmed else "")
        ),
    )
    _add_trial_columns(table, to_train=goal.sized_or_priced)
    for trial in trials:
        if trial.record.duplicate_of is not None:
            continue
        record = trial.record
        ok = trial.status == "ok"
        rate = record.samples_per_s
        spread = ""
        if ok and rate:
            half = (record.samples_per_s_max - record.samples_per_s_min) / 2
            spread = f" ±{100 * half / rate:.0f}%"
        is_best = decided is not None and trial.number == decided.trial
        gpus = trial.candidate.data_parallel_size if record.candidate is not None else 1
        table.add_row(
            f"{trial.number}{'*' if is_best else ''}",
            trial.status,
            record.label,
            f"{rate:.1f}{spread}" if ok else "",
            f"{record.tokens_per_s:.0f}" if ok else "",
            format_bytes(record.peak_bytes) if record.peak_bytes else "",
            *([goal.brief(rate, gpus) if ok else ""] if goal.sized_or_priced else []),
            _note(trial, decided),
        )
    return table


def goal_lines(study: optuna.Study) -> list[str]:
    """The objective the study ranks by and the best's time and cost to train, where the
    study's goal says more than speed; then the fastest at each world size searched and of
    each training backend measured, and each backend the space lists that the study could
    not train with, and why."""
    from autotune import training_goal
    from autotune.study import best, dropped_backends, records
    from autotune.study.backend_comparison import backend_lines

    goal = training_goal.of_study(study)
    trials = records.views(study)
    lines = []
    decided = best.of_study(study)
    if goal.says_more_than_speed:
        lines.append(f"objective: {goal.describe()}")
        if decided is not None:
            outcome = goal.outcome(decided.samples_per_s, decided.gpus)
            lines[-1] += f"; the best, trial {decided.trial}, " + (
                outcome or "is the " + goal.noun(decided.samples_per_s)
            )
    dropped = [d.line for d in dropped_backends(study)]
    return lines + records.world_size_lines(trials, goal) + backend_lines(trials) + dropped


def loss_check_lines(study: optuna.Study) -> list[str]:
    """The study's loss checks (``autotune verify``), one line each, the best's first; for
    a best never checked, how to check it."""
    from autotune.study import best
    from autotune.study import loss_checks as checks

    decided = best.of_study(study)
    chosen = decided.trial if decided is not None else None
    kept = checks.load_all(study)
    lines = [
        f"loss check of trial {number} ({check.label}) against {check.reference_label}, "
        f"{check.steps} step(s): {check.verdict.text}"
        + (
            " (set aside by --verify strict: never the best)"
            if check.set_aside
            else ""
            if number == chosen
            else " (not the best)"
        )
        for number, check in sorted(kept.items(), key=lambda item: (item[0] != chosen, item[0]))
    ]
    if chosen is not None and chosen not in kept:
        lines.insert(
            0,
            f"loss check of the best (trial {chosen}): not run; autotune verify --study "
            f"{study.study_name} trains it against its reference and compares the losses",
        )
    return lines


def _add_trial_columns(table: Table, *, to_train: bool = False) -> None:
    """The columns of :func:`trials_table` (``to_train``: the time and cost to train, where
    the study's goal gives a size or a price). In a narrow terminal (80 columns) the
    candidate and the note wrap at their spaces; the numbers and every header stay whole, so
    the columns can still be read."""
    columns = [
        ("#", "right", False),
        ("status", "left", False),
        ("candidate", "left", True),
        ("samples/s", "right", False),
        ("tokens/s", "right", False),
        ("peak/rank", "right", False),
        ("note", "left", True),
    ]
    if to_train:
        columns.insert(-1, ("to train", "right", False))
    for column, justify, wraps in columns:
        table.add_column(
            column,
            justify=justify,
            no_wrap=not wraps,
            min_width=None if wraps else len(column),
            overflow="fold" if wraps else "ellipsis",
        )


def _note(trial: records.TrialView, decided: best.Best | None) -> str:
    record = trial.record
    if decided is not None and decided.trial == trial.number and decided.confirmed:
        return (
            f"confirmed: {decided.samples_per_s:.1f} ±{decided.half_width:.1f} samples/s over "
            f"{decided.probes} probes"
        )
    if record.confirmation_of is not None:
        return f"confirmation probe of trial {record.confirmation_of}"
    if record.stopped_early and not record.error:
        return "stopped early: clearly slower than the best so far"
    if record.retry_of is not None:
        text = f"retry of interrupted trial {record.retry_of}"
        return f"{text}; {record.error}"[:100] if record.error else text
    if trial.state == "WAITING":
        return "queued: probed again at the next run"
    # an ok trial's error says which limit its measurement is over (empty within them)
    return record.error[:120]


@dataclass
class SpaceFacts:
    """What ``autotune space`` found: the valid candidates of a space on this hardware."""

    space: str
    hardware: str
    gpus: int
    global_batch: int | None  # None: searched (--global-batch auto)
    max_global_batch: int | None
    notes: list[str]
    dropped_backends: list[DroppedBackend]  # listed backends this machine cannot train with
    dimensions: dict[str, dict[str, int]]  # dimension -> value -> candidates
    candidates: int
    examples: list[Candidate]


def space_facts(
    space_ref: str,
    *,
    gpus: int,
    workload: str,
    global_batch: int | str | None,
    max_global_batch: int | None,
    nvme_path: Path | None,
    examples: int,
) -> SpaceFacts:
    """The valid candidates of a space on this hardware, per dimension, with examples."""
    import random

    from autotune.backends import cpu_rank_libraries
    from autotune.hardware import detect
    from autotune.run import bind_space, check_nvme_path, workload_space
    from autotune.space import load_space
    from autotune.workloads import get_workload

    hardware = detect()
    hardware.check_ranks(gpus)
    the_workload = get_workload(workload)
    dropped: list[str] = []
    spec = workload_space(load_space(space_ref), the_workload, workload, hardware, dropped)
    batch = None if global_batch == "auto" else global_batch
    if global_batch is None:
        batch = the_workload.default_global_batch
    bound = bind_space(
        spec,
        hardware,
        ranks=gpus,
        global_batch=batch,  # type: ignore[arg-type]
        max_global_batch=max_global_batch,
        nvme_path=check_nvme_path(nvme_path),
        workload=the_workload if spec.checkpoint_fraction is not None else None,
    )
    candidates = list(bound.candidates())
    return SpaceFacts(
        space=space_ref,
        hardware=hardware.describe(gpus, cpu_rank_libraries(bound.backends)),
        gpus=gpus,
        global_batch=batch,  # type: ignore[arg-type]
        max_global_batch=max_global_batch,
        notes=[*dropped, *bound.notes],
        dropped_backends=list(bound.dropped_backends),
        dimensions={
            name: {str(value): n for value, n in counts.items()}
            for name, counts in bound.dimensions().items()
        },
        candidates=len(candidates),
        examples=random.Random(0).sample(candidates, min(examples, len(candidates))),
    )


def space_report(facts: SpaceFacts) -> Group:
    """``autotune space``'s text for :func:`space_facts`' result."""
    batch = facts.global_batch
    lines = [
        Text(facts.hardware),
        Text(
            f"space {facts.space}: {facts.candidates} valid candidate(s) for {facts.gpus} "
            f"rank(s), global batch {batch if batch else f'auto (up to {facts.max_global_batch})'}"
        ),
    ]
    lines += [Text(f"note: {note}") for note in facts.notes]
    table = Table(title="candidates per value of each dimension")
    table.add_column("dimension")
    table.add_column("value: candidates")
    for name, counts in facts.dimensions.items():
        table.add_row(name, ", ".join(f"{value}: {n}" for value, n in counts.items()))
    lines.append(table)
    lines.append(Text("examples:"))
    lines += [Text(f"  {candidate.label}") for candidate in facts.examples]
    return Group(*lines)


def plan_report(planned: Planned, *, limit_rows: int | None) -> Group:
    """``autotune plan``'s tables for :func:`plan_candidates`' result."""
    fitting = sum(1 for r in planned.rows if r.fits)
    header = [
        Text(
            f"{planned.description}: {planned.params / 1e9:.2f}B parameters ("
            + (
                f"{planned.active_params / 1e9:.2f}B per token, "
                if planned.active_params < planned.params
                else ""
            )
            + f"largest layer {planned.largest_layer_params / 1e6:.0f}M); {planned.gpus} GPU(s) of "
            f"{format_bytes(planned.vram_bytes)}, limit {format_bytes(planned.limit_bytes)} "
            f"after the {100 * planned.margin:.0f}% margin; host RAM "
            f"{format_bytes(planned.host_ram_bytes)}; global batch {planned.global_batch}"
        ),
        Text(
            f"{fitting} of {len(planned.rows)} valid candidates fit "
            f"(planned in {planned.seconds:.0f} s, no GPU used)"
        ),
    ]
    header += [Text(f"note: {note}") for note in planned.notes]
    table = Table(title="fitting first, then by device memory; GiB per rank")
    for column, justify in (
        ("fits", "left"),
        ("candidate", "left"),
        ("device", "right"),
        ("host", "right"),
        ("peak at", "left"),
    ):
        table.add_column(column, justify=justify, no_wrap=column != "candidate")
    rows = planned.rows
    shown = rows if limit_rows is None else rows[:limit_rows]
    for row in shown:
        table.add_row(
            "yes" if row.fits else f"no ({row.why})",
            row.candidate.label,
            "" if row.device_bytes is None else f"{row.device_bytes / 2**30:.1f}",
            "" if row.host_bytes is None else f"{row.host_bytes / 2**30:.1f}",
            row.phase,
        )
    footer = []
    if limit_rows is not None and len(rows) > limit_rows:
        footer.append(Text(f"... {len(rows) - limit_rows} more (use --all to list every one)"))
    return Group(*header, table, *footer)
