"""Text reports of a study: the trials table of ``autotune status``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Group
from rich.table import Table
from rich.text import Text

from autotune.settings import format_bytes
from autotune.study import is_duplicate, study_config

if TYPE_CHECKING:
    import optuna


def trials_table(study: optuna.Study) -> Table:
    """One row per evaluated candidate (duplicate proposals are counted in the caption)."""
    config = study_config(study)
    limit = config.vram_limit_bytes if config else None
    trials = study.get_trials(deepcopy=False)
    duplicates = sum(1 for t in trials if is_duplicate(t))
    best = _best_number(study)
    table = Table(
        title=f"study {study.study_name}"
        + (
            f": {config.workload}, {config.gpus_per_trial} rank(s), global batch "
            f"{config.global_batch}"
            if config
            else ""
        ),
        caption=(
            f"{len(trials) - duplicates} evaluated, {duplicates} duplicate proposal(s) not shown; "
            + (f"limit {format_bytes(limit)} per rank; " if limit else "")
            + "* = best feasible"
        ),
    )
    for column, justify in (
        ("#", "right"),
        ("status", "left"),
        ("candidate", "left"),
        ("samples/s", "right"),
        ("tokens/s", "right"),
        ("peak GiB/rank", "right"),
        ("note", "left"),
    ):
        table.add_column(column, justify=justify, no_wrap=column != "note")
    for trial in trials:
        if is_duplicate(trial):
            continue
        attrs = trial.user_attrs
        status = attrs.get("status", trial.state.name.lower())
        ok = status == "ok"
        rate = attrs.get("samples_per_s", 0.0)
        spread = ""
        if ok and rate:
            half = (attrs.get("samples_per_s_max", rate) - attrs.get("samples_per_s_min", rate)) / 2
            spread = f" ±{100 * half / rate:.0f}%"
        peaks = attrs.get("peak_bytes_per_rank") or []
        table.add_row(
            f"{trial.number}{'*' if trial.number == best else ''}",
            status,
            attrs.get("label", ""),
            f"{rate:.1f}{spread}" if ok else "",
            f"{attrs.get('tokens_per_s', 0):.0f}" if ok else "",
            ",".join(f"{p / 2**30:.2f}" for p in peaks),
            "" if ok else str(attrs.get("error", ""))[:120],
        )
    return table


def _best_number(study: optuna.Study) -> int | None:
    from autotune.export import best_trial

    best = best_trial(study)
    return None if best is None else best.number


def space_report(
    space_ref: str,
    *,
    gpus: int,
    workload: str,
    global_batch: int | str | None,
    max_global_batch: int | None,
    nvme_path: Path | None,
    examples: int,
) -> Group:
    """``autotune space``: what a space holds on this hardware, per dimension, with examples."""
    import random

    from autotune.hardware import detect
    from autotune.plan import bind_space, check_nvme_path
    from autotune.space import load_space
    from autotune.workloads import get_workload

    spec = load_space(space_ref)
    hardware = detect()
    hardware.check_ranks(gpus)
    batch = None if global_batch == "auto" else global_batch
    if global_batch is None:
        batch = get_workload(workload).default_global_batch
    bound = bind_space(
        spec,
        hardware,
        ranks=gpus,
        global_batch=batch,  # type: ignore[arg-type]
        max_global_batch=max_global_batch,
        nvme_path=check_nvme_path(nvme_path),
    )
    candidates = list(bound.candidates())
    lines = [
        Text(hardware.describe(gpus)),
        Text(
            f"space {space_ref}: {len(candidates)} valid candidate(s) for {gpus} rank(s), "
            f"global batch {batch if batch else f'auto (up to {max_global_batch})'}"
        ),
    ]
    lines += [Text(f"note: {note}") for note in bound.notes]
    table = Table(title="candidates per value of each dimension")
    table.add_column("dimension")
    table.add_column("value: candidates")
    for name, counts in bound.dimensions().items():
        table.add_row(name, ", ".join(f"{value}: {n}" for value, n in counts.items()))
    lines.append(table)
    sample = random.Random(0).sample(candidates, min(examples, len(candidates)))
    lines.append(Text("examples:"))
    lines += [Text(f"  {candidate.label}") for candidate in sample]
    return Group(*lines)
