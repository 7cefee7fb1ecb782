"""What the export says to a person: ``summary.md`` and ``launch.sh``.

Both are rendered from the trial records and the one decision of the best
(:mod:`autotune.study.best`): the chosen configuration, why (the confirmed estimate when the
confirmation round decided it), the trials the loss check set aside, the runners-up in the
same ranking, the loss check, what the search did, and what the user must do in their own
code. Text from the storage (study names, labels) is
quoted or escaped before it reaches the shell script.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import TYPE_CHECKING

from autotune.backends import printable
from autotune.export._loss_check_lines import loss_check_lines, set_aside_lines
from autotune.export._setting_lines import setting_rows, user_actions_of
from autotune.protocol import HOST_PEAK_WORDS
from autotune.study import records
from autotune.study.backend_comparison import backend_lines
from autotune.study.confirmation import ESTIMATE_OF
from autotune.units import format_bytes

if TYPE_CHECKING:
    import optuna

    from autotune.candidate import Candidate
    from autotune.study import Best, Confirmation, StudyConfig, TrialRecord, TrialView
    from autotune.training_goal import TrainingGoal

RUNNERS_UP = 5


def _peaks(values: list[int]) -> str:
    return ", ".join(format_bytes(v) for v in values) or "n/a"


def render_launch(study_name: str, trial: TrialView, config: StudyConfig) -> str:
    if config.script is not None:  # the user's own script, with its arguments
        from autotune.export._script_export import render_script_launch

        return render_script_launch(study_name, trial, config)
    from autotune.backends import get_backend
    from autotune.export._numerics import production_env
    from autotune.export._production_config import production_config

    origin = printable(f"study {study_name!r}, trial {trial.number} ({trial.label})")
    return get_backend(trial.candidate.backend).launch_script(
        origin,
        trial.candidate.data_parallel_size,  # the world size it was chosen for
        config.accelerator,
        config.threads_per_rank,
        production_env(config),
        production_config(trial, config),
    )


def outcome_counts(trials: list[TrialView]) -> Counter[str]:
    """Evaluated candidates by how their evaluation ended, in words."""
    counts: Counter[str] = Counter()
    for trial in trials:
        record = trial.record
        if trial.feasible:
            counts["feasible, measured in full"] += 1
        elif trial.status == "ok" and record.stopped_early and record.feasible:
            counts["feasible, stopped early as clearly slower than the best so far"] += 1
        elif trial.status == "ok" and record.over_host_ram and not _over_device(record):
            counts["infeasible: measured host memory above --host-ram"] += 1
        elif trial.status == "ok":
            counts["infeasible: measured peak above the limit"] += 1
        elif trial.status == "oom":
            counts["infeasible: ran out of memory in the probe"] += 1
        elif trial.status == "pruned":
            counts[f"infeasible, not probed: {record.pruned_by}"] += 1
        elif trial.status in records.FAILED_STATUSES:
            counts[f"failed: {trial.status}"] += 1
    return counts


def _over_device(record: TrialRecord) -> bool:
    return record.peak_bytes > record.vram_limit_bytes


def _host_memory_line(record: TrialRecord) -> str:
    """The ranks' host memory in the words of how it was measured, and each node's sum
    against the --host-ram it was judged against."""
    words = HOST_PEAK_WORDS[record.host_peak_method]
    line = f"- Host memory per rank process, {words}: {_peaks(record.host_peak_bytes_per_rank)}"
    if record.host_ram_bytes:
        nodes = "; ".join(
            f"{format_bytes(total)} on {node or 'its node'}"
            for node, total in record.host_peak_per_node().items()
        )
        line += f"; summed per node {nodes}, of --host-ram {format_bytes(record.host_ram_bytes)}"
    return line + "."


def _searched(config: StudyConfig) -> str:
    """ " (chosen among world sizes 1, 2, 4)" for a study that searched them."""
    if not config.world_sizes:
        return ""
    return f" (chosen among world sizes {', '.join(map(str, config.world_sizes))})"


def standings(
    trials: list[TrialView],
    verdict: Confirmation | None,
    decided: Best | None,
    set_aside: Collection[int] = (),
    goal: TrainingGoal | None = None,
) -> list[tuple[TrialView, float, str]]:
    """Every feasible trial once, best first by ``goal``, each with the estimate it is
    ranked by: the confirmed contenders in the verdict's order, each by its estimate (the
    lower of its probes' median and mean), then the rest by their single measurement; the
    decided best leads. A trial ``set_aside`` by its loss check (``run --verify strict``) is
    not among them."""
    ranked = [t for t in records.ranked_feasible(trials, goal) if t.number not in set_aside]
    by_number = {t.number: t for t in ranked}
    rows: list[tuple[TrialView, float, str]] = []
    confirmed = decided is not None and decided.confirmed and verdict is not None
    if confirmed:
        assert verdict is not None
        for contender in verdict.contenders:
            if contender.trial in by_number:
                rows.append(
                    (by_number.pop(contender.trial), contender.estimate, "confirmed estimate")
                )
    rows += [(t, float(t.value or 0.0), "one probe") for t in by_number.values()]
    if decided is not None:
        rows.sort(key=lambda row: row[0].number != decided.trial)
    return rows


def _why(
    trial: TrialView,
    decided: Best | None,
    ranked: int,
    verdict: Confirmation | None,
    goal: TrainingGoal,
) -> list[str]:
    record = trial.record
    steps = (
        f"{record.samples_per_s:.1f} samples/s in its search probe (steps ranged "
        f"{record.samples_per_s_min:.1f}-{record.samples_per_s_max:.1f})"
    )
    if decided is not None and decided.trial == trial.number and decided.confirmed:
        lead = f"- {_confirmed_how(decided, verdict, goal)}; {steps}."
    elif decided is not None and decided.trial == trial.number:
        noun = goal.noun(float(trial.value or 0.0)).capitalize()
        lead = f"- {noun} of {ranked} feasible configurations measured: {steps}."
    else:
        best_text = (
            f"trial {decided.trial} ({decided.label})" if decided is not None else "none yet"
        )
        lead = f"- Chosen with --trial {trial.number}; the best is {best_text}. It ran {steps}."
    if record.tokens_per_s == record.samples_per_s:  # a model without tokens
        return [lead]
    return [lead, f"- {record.tokens_per_s:.0f} tokens/s in that probe."]


def _goal_lines(goal: TrainingGoal, trial: TrialView, decided: Best | None) -> list[str]:
    """The objective the best was chosen by and what this configuration means for the
    production run (its time and cost to train, at the estimate the decision rests on),
    where the goal says more than speed."""
    gpus, rate = trial.candidate.data_parallel_size, float(trial.value or 0.0)
    if decided is not None and decided.trial == trial.number:
        rate = decided.samples_per_s
    outcome = goal.outcome(rate, gpus)
    if goal.ranks_by_speed_alone and not outcome:
        return []
    lines = [f"- Objective: {goal.describe()}."]
    if outcome:
        lines.append(f"- On {gpus} GPU(s) at {rate:.1f} samples/s it {outcome}.")
    if goal.misses_deadline(rate):
        lines.append(
            "- No configuration measured finishes within the deadline: the fastest is chosen."
        )
    return lines


def _confirmed_how(decided: Best, verdict: Confirmation | None, goal: TrainingGoal) -> str:
    """How the confirmation round chose ``decided``, and the estimate it rests on: the lower
    of the median and the mean of the search probe and the round's re-probes."""
    reprobes = decided.probes - 1
    estimate = (
        f"{decided.samples_per_s:.1f} samples/s ±{decided.half_width:.1f} (95% interval), the "
        f"{ESTIMATE_OF.removeprefix('the ')} its search probe and {reprobes} interleaved "
        f"re-probe{'s' * (reprobes != 1)}"
    )
    if verdict is not None and verdict.winner not in (None, decided.trial):
        return (
            f"The confirmation round's best feasible contender (its winner, trial "
            f"{verdict.winner}, is not feasible now): {estimate}"
        )
    if verdict is not None and verdict.simpler_over is not None:
        return (
            f"Chosen by the confirmation round as the simpler: within noise of trial "
            f"{verdict.simpler_over}'s higher estimate, with fewer moving parts "
            f"({verdict.simpler_reason()}); {estimate}"
        )
    if verdict is not None and verdict.steadier_over is not None:
        return (
            f"Chosen by the confirmation round as the steadier: within noise of trial "
            f"{verdict.steadier_over}'s higher estimate and markedly steadier; {estimate}"
        )
    return f"Confirmed the {goal.noun(decided.samples_per_s)}: {estimate}"


def render_summary(
    study: optuna.Study, trial: TrialView, config: StudyConfig, decided: Best | None
) -> str:
    from autotune import training_goal
    from autotune.study import confirmation as confirm
    from autotune.study import dropped_backends, screened_keys
    from autotune.study import loss_checks as checks

    goal = training_goal.of_study(study)
    candidate = trial.candidate
    record = trial.record
    trials = records.views(study)
    evaluated = records.evaluations(trials)
    verdict = confirm.load(study)
    aside = checks.set_aside(study)
    rows = standings(trials, verdict, decided, aside, goal)
    limit = config.vram_limit_bytes
    memory_kind = "device memory" if config.accelerator == "cuda" else "tracked tensor memory"
    lines = [
        f"# autotune: {candidate.label}",
        "",
        f"Study `{study.study_name}`, trial {trial.number}: workload `{config.workload}` on "
        f"{candidate.data_parallel_size} "
        f"{'GPU' if config.accelerator == 'cuda' else 'CPU rank'}(s){_searched(config)}, "
        f"memory limit {format_bytes(limit)} per rank.",
        "",
        "## Chosen configuration",
        "",
        *setting_rows(candidate, searched=bool(config.world_sizes)),
        "",
        "## Why",
        "",
        *_why(trial, decided, len(rows), verdict, goal),
        *_goal_lines(goal, trial, decided),
        *set_aside_lines(study, trials, aside),
        f"- Peak {memory_kind} per rank: {_peaks(record.peak_bytes_per_rank)} "
        f"of {format_bytes(limit)} allowed.",
    ]
    if record.host_peak_bytes_per_rank:
        lines.append(_host_memory_line(record))
    lines.append(f"- {runner_up_distance(rows, verdict, goal)}")
    if verdict is not None and verdict.contenders:
        lines += ["", *_confirmation_lines(verdict, trial.number)]
    lines += _front_lines(trials, goal)
    lines += ["", *loss_check_lines(study, trial.number)]
    others = [row for row in rows if row[0].number != trial.number]
    if others:
        lines += ["", *_runner_up_lines(rows[0][1], others)]
    if config.script is not None:
        from autotune.export._script_export import script_summary_lines

        lines += ["", *script_summary_lines(trial, config)]
    lines += ["", "## Search", "", *_search_lines(evaluated, screened_keys(study))]
    lines += [f"- The space's {d.line}." for d in dropped_backends(study)]
    lines += ["", "## What you must do", ""]
    lines += [f"- {action}" for action in user_actions_of(candidate, trial, config)]
    lines += ["", "## Files", "", *_file_lines(config, candidate), ""]
    lines += _code_lines(trial, config)
    return "\n".join(lines)


def _front_lines(trials: list[TrialView], goal: TrainingGoal) -> list[str]:
    """The fastest of each backend and at each world size, where the study measured more
    than one."""
    lines = []
    backends = backend_lines(trials)
    if backends:
        lines += ["", "## DeepSpeed or FSDP2", "", "The fastest measured with each backend:"]
        lines += ["", *backends]
    front = records.world_size_lines(trials, goal)
    if front:
        lines += ["", "## World sizes", "", "The fastest measured at each world size searched:"]
        lines += ["", *front]
    return lines


def _file_lines(config: StudyConfig, candidate: Candidate) -> list[str]:
    from autotune.backends import get_backend

    name = printable(config.script.name) if config.script is not None else None
    return get_backend(candidate.backend).config_usage_lines(candidate.data_parallel_size, name)


def _code_lines(trial: TrialView, config: StudyConfig) -> list[str]:
    """The backend's lines of code for a plain-torch script (FSDP2's ``fully_shard``
    calls), under their own heading; none for DeepSpeed."""
    from autotune.backends import get_backend
    from autotune.export._production_config import production_config

    code = get_backend(trial.candidate.backend).code_lines(production_config(trial, config))
    if not code:
        return []
    return [
        "## In a plain-torch script",
        "",
        "The tuned settings as `fully_shard` calls, for a script that does not use accelerate:",
        "",
        "```python",
        *code,
        "```",
        "",
    ]


def _confirmation_lines(verdict: Confirmation, chosen: int) -> list[str]:
    extra = (
        f", then {verdict.tie_rounds} more of the two closest to rank them"
        if verdict.tie_rounds
        else ""
    )
    if verdict.left_race:
        extra += (
            f"; trial(s) {', '.join(map(str, verdict.left_race))} left the rounds early, out "
            "of the winner's noise"
        )
    lines = [
        "## Confirmation round",
        "",
        f"The top {len(verdict.contenders)} were probed again, interleaved, in "
        f"{verdict.rounds} round(s){extra} ({verdict.seconds:.0f} s of the budget); the "
        f"{ESTIMATE_OF.removeprefix('the ')} every probe of each, with its 95% interval and "
        "how far the probes ranged:",
        "",
    ]
    for contender in verdict.contenders:
        mark = " (chosen)" if contender.trial == chosen else ""
        lines.append(f"- trial {contender.trial} {contender.describe(verdict.goal)}{mark}")
    by_trial = {c.trial: c for c in verdict.contenders}
    if verdict.simpler_over is not None and verdict.simpler_over in by_trial:
        winner, faster = verdict.contenders[0], by_trial[verdict.simpler_over]
        lines.append(
            f"- {winner.label}: {winner.estimate:.1f} samples/s; {faster.label}: "
            f"{faster.estimate:.1f} — within noise of each other: chose the simpler "
            f"({verdict.simpler_reason()}), which needs less host memory and fails in fewer "
            "ways; a contender ahead by more than its noise would have won."
        )
    elif verdict.steadier_over is not None and verdict.steadier_over in by_trial:
        winner, faster = verdict.contenders[0], by_trial[verdict.steadier_over]
        lines.append(
            f"- {winner.label}: {winner.estimate:.1f} samples/s, spread "
            f"±{100 * winner.spread:.0f}%; {faster.label}: {faster.estimate:.1f}, spread "
            f"{min(faster.samples_per_s):.1f}..{max(faster.samples_per_s):.1f} — within "
            "noise of each other: chose the steadier, which is fast every time."
        )
    elif verdict.tie:
        lines.append(
            "- The best two overlap within the noise of this machine: either is a sound "
            "choice; the higher estimate was taken."
        )
    return lines


def _runner_up_lines(lead: float, others: list[tuple[TrialView, float, str]]) -> list[str]:
    lines = [
        "## Runners-up",
        "",
        "| trial | configuration | samples/s | ranked by | of the chosen | peak per rank |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for other, estimate, basis in others[:RUNNERS_UP]:
        share = 100 * estimate / lead if lead else 0.0
        lines.append(
            f"| {other.number} | {other.label} | {estimate:.1f} | {basis} | {share:.0f}% | "
            f"{_peaks(other.record.peak_bytes_per_rank)} |"
        )
    return lines


def _search_lines(evaluated: list[TrialView], screened: set[str]) -> list[str]:
    counts = outcome_counts(evaluated)
    lines = [f"- {len(evaluated)} candidates evaluated:"]
    lines += [f"  - {reason}: {count}" for reason, count in sorted(counts.items())]
    never = screened - {t.record.candidate_key for t in evaluated}
    if never:
        lines.append(
            f"- {len(never)} more candidates were predicted over the limit by the memory "
            "model and never proposed (`autotune plan --all` shows each prediction)."
        )
    return lines


def user_actions(trial: TrialView, config: StudyConfig) -> list[str]:
    """What the user must do in their own code to run ``trial``'s configuration."""
    return user_actions_of(trial.candidate, trial, config)


def runner_up_distance(
    rows: list[tuple[TrialView, float, str]],
    verdict: Confirmation | None,
    goal: TrainingGoal | None = None,
) -> str:
    """One line: how far the best (first of :func:`standings`' rows) is from the runner-up,
    in ``goal``'s units where they are not samples/s (per GPU under a cost objective across
    world sizes), and whether the difference is beyond the noise the confirmation round
    measured."""
    from autotune.training_goal import TrainingGoal

    goal = goal or TrainingGoal()
    if len(rows) < 2:
        return "No runner-up: only one feasible configuration was measured in full."
    (first, lead, basis), (second, other, other_basis) = rows[0], rows[1]
    name = f"trial {second.number} ({second.label})"
    same = basis if basis == other_basis else f"{basis} vs {other_basis}"
    gpus = (first.candidate.data_parallel_size, second.candidate.data_parallel_size)
    (tier, value), (other_tier, other_value) = goal.score(lead, gpus[0]), goal.score(other, gpus[1])
    if tier != other_tier:
        line = (
            f"The runner-up, {name}, does not train the run's size within the deadline "
            f"({other:.1f} samples/s on {gpus[1]} GPU(s), {same})"
        )
    elif value != lead or other_value != other:  # compared per GPU: the cost of a sample
        gap = 100 * (value - other_value) / value if value else 0.0
        line = (
            f"The runner-up, {name}, costs {gap:.1f}% more per sample ({value:.1f} vs "
            f"{other_value:.1f} samples/s per GPU, {same})"
        )
    else:
        gap = 100 * (lead - other) / lead if lead else 0.0
        text = f"{lead:.1f} vs {other:.1f} samples/s, {same}"
        if gap >= 0:
            line = f"The runner-up, {name}, is {gap:.1f}% slower ({text})"
        else:
            line = f"The runner-up, {name}, measured {-gap:.1f}% faster ({text})"
    by_trial = {c.trial: c for c in verdict.contenders} if verdict is not None else {}
    a, b = by_trial.get(first.number), by_trial.get(second.number)
    if a is None or b is None or len(a.samples_per_s) < 2 or len(b.samples_per_s) < 2:
        return line + "."
    if a.overlaps(b, goal):
        return line + "; their 95% intervals overlap: on this machine the two are within noise."
    return line + "; their 95% intervals do not overlap: the difference is beyond noise."
