"""``autotune resolved --study S --gpus N``: what a study's configurations would do on N GPUs,
from the study's cost model, without probing.

The cost model (:mod:`autotune.run.cost_model`) is fitted on the study's measured probes,
as the search fits it, and predicts each feasible configuration's step time at each world
size asked for: the same global batch (so the configurations train alike) split over N
ranks, the micro-batch kept where it divides the rank's share (else the largest that does),
the ranks spread over ``ceil(N / gpus_per_node)`` nodes (the slower link between nodes when
they span more than one); CPU ranks share the cores the study's ranks had (its threads per
rank times its ranks), as a CPU study's ranks share a machine's. ZeRO's communication
volume grows with (N-1)/N of the model (ZeRO, Rajbhandari et al. 2020, sec. 7) over the
slowest link; the compute per rank shrinks with N. Every number is *predicted*, except
where the study probed that configuration at that world size: then its measurement stands
beside the prediction with the prediction's error. The memory screen (the study's memory
model, taught by its probes) says whether each configuration still fits at N ranks.

The rows are ranked by the :class:`~autotune.training_goal.TrainingGoal`'s objective,
and the choice is said in one line.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from autotune.candidate import Candidate
from autotune.errors import SettingsError
from autotune.training_goal import TrainingGoal
from autotune.units import format_duration

if TYPE_CHECKING:
    import optuna

    from autotune.study import StudyConfig, TrialView


class ForecastRow(BaseModel):
    """One configuration of the study at one world size."""

    model_config = ConfigDict(extra="forbid")

    trial: int = Field(description="The study's trial the configuration was measured in.")
    probed: Candidate = Field(description="The configuration as the trial probed it.")
    candidate: Candidate = Field(description="The configuration at this world size.")
    gpus: int = Field(description="Data-parallel ranks (GPUs) of this row.")
    nodes: int = Field(description="Nodes they span.")
    predicted_samples_per_s: float = Field(description="The fitted cost model's throughput.")
    measured_samples_per_s: float | None = Field(
        default=None,
        description="The study's measurement of this very configuration, where it probed it.",
    )
    fits: bool = Field(description="The memory screen's word at this world size.")
    why_not: str = Field(default="", description="Why it does not fit, where it does not.")
    time_to_train_s: float | None = Field(
        default=None, description="The training run's size at the row's throughput."
    )
    cost_usd: float | None = Field(
        default=None, description="Price x GPUs x time to train (or per million samples)."
    )
    cost_basis: str = Field(default="", description="'run' or 'per million samples'.")
    finishes: bool | None = Field(default=None, description="Within the deadline.")

    @property
    def samples_per_s(self) -> float:
        """The row's throughput: measured where the study probed it, else predicted."""
        return self.measured_samples_per_s or self.predicted_samples_per_s

    @property
    def error(self) -> float | None:
        """The prediction's relative error against the measurement, where there is one."""
        if not self.measured_samples_per_s:
            return None
        return self.predicted_samples_per_s / self.measured_samples_per_s - 1.0


class Forecast(BaseModel):
    """Every row, ranked by the objective, and the choice in one line."""

    model_config = ConfigDict(extra="forbid")

    study: str
    goal: TrainingGoal
    world_sizes: list[int] = Field(description="The world sizes asked for.")
    probed_world_sizes: list[int] = Field(description="Those the study's probes ran at.")
    global_batch: int | None = Field(description="The global batch; None: each trial's own.")
    gpus_per_node: int
    observations: int = Field(description="Measured probes the cost model was fitted on.")
    rows: list[ForecastRow] = Field(description="Ranked by the objective, fitting first.")
    choice: str = Field(description="The objective's answer, in one line.")
    notes: list[str] = Field(default_factory=list)


def forecast(
    study: optuna.Study,
    *,
    world_sizes: tuple[int, ...],
    goal: TrainingGoal,
    gpus_per_node: int,
    global_batch: int | None = None,
    vram_limit_bytes: int | None = None,
) -> Forecast:
    """The study's feasible configurations at each of ``world_sizes`` (module docstring)."""
    from autotune.run.sampler import History
    from autotune.study import records

    config = _checked_config(study)
    trials = records.views(study)
    history = History.of(trials)
    if not history.measured:
        raise SettingsError(
            f"study {study.study_name!r} has no measured probe yet: the cost model has nothing "
            f"to fit; run autotune run --study {study.study_name} first"
        )
    if config.script is not None and goal.train_tokens is not None:
        raise SettingsError(TOKENS_OF_A_SCRIPT)
    workload, facts = _study_workload(config, trials)
    model = _fitted_model(workload, config, trials, history.measured, facts)
    screen = _screen(workload, config, trials, vram_limit_bytes, max(world_sizes), gpus_per_node)
    measured = {t.candidate.key: float(t.value or 0.0) for t in records.ranked_feasible(trials)}
    rows, notes = [], []
    cores = config.threads_per_rank * config.gpus_per_trial  # CPU ranks: the study's cores
    for gpus in world_sizes:
        model.nodes = math.ceil(gpus / gpus_per_node)
        if config.accelerator == "cpu":  # N CPU ranks share those cores, as the search's do
            model.threads = max(1, cores // gpus)
        found, missing = _rows_at(gpus, model, screen, trials, measured, global_batch)
        rows += [_with_goal(row, goal, workload.tokens_per_sample) for row in found]
        notes += missing
    ranked = rank(rows, goal)
    return Forecast(
        study=study.study_name,
        goal=goal,
        world_sizes=list(world_sizes),
        probed_world_sizes=sorted({c.data_parallel_size for c, _ in history.measured}),
        global_batch=global_batch,
        gpus_per_node=gpus_per_node,
        observations=len(history.measured),
        rows=ranked,
        choice=choice_line(ranked, goal),
        notes=list(dict.fromkeys(notes)),
    )


def _rows_at(
    gpus: int,
    model: Any,
    screen: Any,
    trials: list[TrialView],
    measured: dict[str, float],
    global_batch: int | None,
) -> tuple[list[ForecastRow], list[str]]:
    """Each feasible configuration of the study at ``gpus`` ranks, and notes on those whose
    global batch does not split over them."""
    rows, notes = [], []
    seen: set[str] = set()  # two trials may split alike at this world size
    for trial in _configurations(trials):
        batch = global_batch or trial.candidate.train_batch_size
        candidate = resplit(trial.candidate, gpus, batch)
        if candidate is None:
            notes.append(
                f"trial {trial.number} ({trial.label}): a global batch of {batch} does not "
                f"split over {gpus} ranks; give --global-batch"
            )
            continue
        if candidate.key in seen:
            continue
        seen.add(candidate.key)
        verdict = screen.verdict(candidate)
        rows.append(
            ForecastRow(
                trial=trial.number,
                probed=trial.candidate,
                candidate=candidate,
                gpus=gpus,
                nodes=model.nodes,
                predicted_samples_per_s=model.samples_per_s(candidate),
                measured_samples_per_s=measured.get(candidate.key),
                fits=verdict.fits,
                why_not="" if verdict.fits else verdict.reason,
            )
        )
    return rows, notes


TOKENS_OF_A_SCRIPT = (
    "--train-tokens with a script study: autotune counts a script's samples, not its tokens; "
    "give --train-samples (tokens / sequence length)"
)


def _checked_config(study: optuna.Study) -> StudyConfig:
    from autotune.study import study_config

    config = study_config(study)
    if config is None:
        raise SettingsError(f"study {study.study_name!r} was not made by autotune run")
    return config


def _study_workload(config: StudyConfig, trials: list[TrialView]) -> tuple[Any, Any]:
    """The study's workload, and for a script study the cost model's facts: the model its
    probes reported handing to ``deepspeed.initialize`` (a script's model exists only in
    its ranks; its memory is learned from the same reports), in samples, not tokens."""
    if config.script is None:
        from autotune.workloads import get_workload

        return get_workload(config.workload), None
    from autotune.memory import read_probe
    from autotune.run._script_inputs import ScriptWorkload
    from autotune.run.cost_model import WorkloadFacts

    reported = (read_probe(t.record.trial_dir)[0] for t in trials if t.record.trial_dir)
    model = next((m for m in reported if m is not None), None)
    if model is None:
        raise SettingsError(
            "no probe of this script study reported its model (parameters): nothing to "
            "predict other world sizes from; run autotune run --study on it first"
        )
    batch = next(t.candidate.train_batch_size for t in trials if t.record.candidate)
    workload = ScriptWorkload(config.script, batch)
    return workload, WorkloadFacts(params=model.params, tokens_per_sample=1)


def _configurations(trials: list[TrialView]) -> list[TrialView]:
    """The study's feasible configurations, each once (its fastest trial)."""
    from autotune.study import records

    seen: set[str] = set()
    chosen = []
    for trial in records.ranked_feasible(trials):
        key = trial.candidate.model_copy(update={"data_parallel_size": 1}).key
        if key not in seen:
            seen.add(key)
            chosen.append(trial)
    return chosen


def resplit(candidate: Candidate, gpus: int, global_batch: int) -> Candidate | None:
    """``candidate`` on ``gpus`` ranks at ``global_batch``: its micro-batch where it divides
    the rank's share, else the largest that does (None: the batch does not split)."""
    if global_batch % gpus:
        return None
    per_rank = global_batch // gpus
    micro = max(
        m for m in range(1, min(candidate.micro_batch_size, per_rank) + 1) if not per_rank % m
    )
    return candidate.model_copy(
        update={
            "data_parallel_size": gpus,
            "micro_batch_size": micro,
            "gradient_accumulation_steps": per_rank // micro,
        }
    )


def _fitted_model(
    workload: Any,
    config: StudyConfig,
    trials: list[TrialView],
    measured: list[Any],
    facts: Any = None,
) -> Any:
    """The cost model as the search fits it, on the study's measured probes (``facts``: a
    script's model, as its probes reported it)."""
    from autotune.run.cost_model import machine_cost_model

    nodes = max((len(set(t.record.node_per_rank)) for t in trials if t.feasible), default=1)
    model, _ = machine_cost_model(
        workload,
        config.accelerator,
        threads=config.threads_per_rank,
        precisions=tuple(c.precision for c, _ in measured),
        nodes=max(nodes, 1),
        tf32=config.float32_matmul_precision == "high",
        facts=facts,
    )
    model.fit(measured)
    return model


def _screen(
    workload: Any,
    config: StudyConfig,
    trials: list[TrialView],
    vram_limit_bytes: int | None,
    largest: int,
    gpus_per_node: int,
) -> Any:
    from autotune.hardware import detect
    from autotune.run._study_screen import study_memory_screen

    return study_memory_screen(
        workload,
        config,
        trials,
        host_ram_bytes=detect().host_memory_bytes,
        ranks_per_node=min(largest, gpus_per_node),
        vram_limit_bytes=vram_limit_bytes,
    )


def _with_goal(row: ForecastRow, goal: TrainingGoal, tokens_per_sample: int) -> ForecastRow:
    """The row's time to train, cost and deadline verdict, where the goal gives them."""
    seconds = goal.time_to_train_s(row.samples_per_s, tokens_per_sample)
    cost, basis = goal.cost_usd(row.gpus, seconds), "run"
    if cost is None:
        cost, basis = (
            goal.cost_per_million_samples_usd(row.gpus, row.samples_per_s),
            ("per million samples"),
        )
    return row.model_copy(
        update={
            "time_to_train_s": seconds,
            "cost_usd": cost,
            "cost_basis": basis if cost is not None else "",
            "finishes": goal.finishes(seconds),
        }
    )


def rank(rows: list[ForecastRow], goal: TrainingGoal) -> list[ForecastRow]:
    """Fitting rows first, then by the goal's score (:meth:`TrainingGoal.score`, the
    search's ranking): the most samples/s; the least cost (samples/s per GPU, whatever the
    price); under a deadline, those that finish by cost, then the rest by samples/s. A
    row's tier is its ``finishes``, reckoned with the workload's tokens per sample."""

    def key(row: ForecastRow) -> tuple[Any, ...]:
        tier = goal.tier_of(row.finishes)
        return (not row.fits, -tier, -row.samples_per_s * goal.factor(row.gpus, tier))

    return sorted(rows, key=key)


def choice_line(rows: list[ForecastRow], goal: TrainingGoal) -> str:
    """The objective's answer in one line."""
    fitting = [r for r in rows if r.fits]
    if not fitting:
        return "no configuration of the study fits at these world sizes by the memory model"
    best = fitting[0]
    what = f"{best.candidate.label} on {best.gpus} GPU(s), {_rate(best)}"
    extra = _time_and_cost(best)
    if goal.deadline_s is None:  # throughput or cost: the goal's noun for its best
        return f"{goal.noun(best.samples_per_s)}: {what}{extra}"
    deadline = format_duration(goal.deadline_s)
    if best.finishes:
        return f"cheapest that finishes within {deadline}: {what}{extra}"
    fastest = min(fitting, key=lambda r: r.time_to_train_s or math.inf)
    return (
        f"none finishes within {deadline}: the fastest, {fastest.candidate.label} on "
        f"{fastest.gpus} GPU(s), {_rate(fastest)}{_time_and_cost(fastest)}"
    )


def _rate(row: ForecastRow) -> str:
    kind = "measured" if row.measured_samples_per_s else "predicted"
    return f"{row.samples_per_s:.1f} samples/s ({kind})"


def _time_and_cost(row: ForecastRow) -> str:
    parts = []
    if row.time_to_train_s is not None:
        parts.append(f"trains in {format_duration(row.time_to_train_s)}")
    if row.cost_usd is not None:
        parts.append(
            f"${row.cost_usd:,.2f}" + (" per million samples" if row.cost_basis != "run" else "")
        )
    return f"; {', '.join(parts)}" if parts else ""
