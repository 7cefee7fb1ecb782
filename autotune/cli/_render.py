"""Plain-line rendering of a run's events (pipes, CI, ``--quiet`` terminals): one line per
event worth a line. Part of the command line; the library emits, this renders."""

from __future__ import annotations

from functools import singledispatch

from autotune import events
from autotune.units import format_bytes, format_duration

# The JIT build of one op on 2 busy cores, as benchmarks/RESULTS.md records it (CPU Adam is
# the longest).
BUILD_ESTIMATE = "one time, 1-3 min"


@singledispatch
def line(event: events.Event) -> str | None:
    """The line for ``event``, or None for events without one."""
    return None


@line.register
def _(event: events.OpBuildStarted) -> str:
    return f"building DeepSpeed's {event.op} op ({BUILD_ESTIMATE}) ..."


@line.register
def _(event: events.OpBuildWaiting) -> str:
    return f"waiting for another process that is building or loading DeepSpeed's {event.op} op ..."


@line.register
def _(event: events.OpBuildFinished) -> str:
    return f"built DeepSpeed's {event.op} op in {event.seconds:.0f} s (cached from now on)"


@line.register
def _(event: events.BuildLockCleared) -> str:
    return f"note: removed the build lock a killed process left in {event.op}/"


@line.register
def _(event: events.OpUnavailable) -> str:
    if event.fallback == "torch_adam":
        return (
            f"note: DeepSpeed's FusedAdam does not build here ({event.cause}; log in "
            f"{event.log_dir}/): probes and the exported config use torch's Adam "
            "(optimizer.params.torch_adam); install the CUDA toolkit matching torch's CUDA "
            "for FusedAdam"
        )
    return f"note: NVMe offload is unavailable: DeepSpeed's async I/O op ({event.cause})"


@line.register
def _(event: events.OpsBuilt) -> str:
    return (
        f"built DeepSpeed's {', '.join(event.ops)} op(s) in {event.seconds:.0f} s, once for "
        "this environment (not charged to the budget)"
    )


@line.register
def _(event: events.DriverTakenOver) -> str:
    return (
        f"taking over study {event.study_name!r} from a stopped driver: {event.holder.describe()}"
    )


@line.register
def _(event: events.HeartbeatNotWritten) -> str:
    return f"warning: heartbeat not written ({event.error_type}: {event.error})"


@line.register
def _(event: events.CostModelCalibrated) -> str:
    rates = ", ".join(f"{p} {rate / 1e9:.0f}" for p, rate in event.flops_per_s.items())
    return (
        f"cost model: this CPU's matmul GFLOP/s at {event.threads_per_rank} thread(s) per "
        f"rank: {rates}"
    )


@line.register
def _(event: events.TrialsRecovered) -> str:
    numbers = ", ".join(str(n) for n in event.interrupted)
    return (
        f"trial(s) {numbers} were left running by a stopped driver: recorded as interrupted; "
        "each candidate is probed again, once"
    )


@line.register
def _(event: events.FailedRequeued) -> str:
    if not event.trial_numbers:
        return "--retry-failed: no failed candidate to retry; the search goes on"
    numbers = ", ".join(str(n) for n in event.trial_numbers)
    return (
        f"requeued {len(event.trial_numbers)} failed candidate(s): trial(s) {numbers}; each "
        "is probed once more"
    )


@line.register
def _(event: events.RunStarted) -> str:
    return (
        f"study {event.study_name!r}: {event.evaluated_before} candidate(s) evaluated before, "
        f"{event.valid_candidates} valid in the space; budget "
        f"{format_duration(event.budget_total_s)}, {format_duration(event.spent_before_s)} "
        f"spent before, {format_duration(event.left_s)} left; probe timeout "
        f"{format_duration(event.probe_timeout_s)}"
    )


@line.register
def _(event: events.CandidatesScreened) -> str:
    return (
        f"memory model: {event.screened} of {event.unevaluated} unevaluated candidate(s) "
        f"predicted over the {format_bytes(event.vram_limit_bytes)} limit per rank (or the "
        "host's memory); the sampler skips them (autotune plan --all shows each prediction)"
    )


def _who(trial: int | None) -> str:
    return "confirmation" if trial is None else f"trial {trial}"


@line.register
def _(event: events.ProbeStarted) -> str:
    return f"{_who(event.trial)}: probing {event.label}"


@line.register
def _(event: events.ProbeFinished) -> str:
    result = event.result
    peak = f"peak {format_bytes(result.peak_bytes)} of {format_bytes(event.vram_limit_bytes)}"
    if result.status == "ok" and result.stopped_early:
        outcome = (
            f"stopped early after {len(result.step_times_s)} step(s): "
            f"{result.samples_per_s:.1f} samples/s, clearly below the best so far"
        )
    elif result.status == "ok":
        # a model without tokens (tokens_per_sample 1) says samples/s only
        tokens = (
            ""
            if result.tokens_per_s == result.samples_per_s
            else (f"{result.tokens_per_s:.0f} tokens/s, ")
        )
        outcome = (
            f"{result.samples_per_s:.1f} samples/s (±{100 * result.spread / 2:.0f}%), "
            f"{tokens}{peak}"
        )
    elif result.status == "oom":
        outcome = f"out of memory, infeasible ({result.error})"
    else:
        outcome = f"{result.status}: {result.error} (log: {event.log_path})"
    if result.status == "ok" and event.over_limits:
        outcome += f"; infeasible: {event.over_limits}"
    if result.warm_fallback:
        outcome += f"; {result.warm_fallback}"
    return f"{_who(event.trial)}: {event.label} -> {outcome} [{result.wall_s:.0f} s]"


@line.register
def _(event: events.CandidatePruned) -> str:
    return f"trial {event.trial}: {event.label} -> infeasible, not probed: {event.reason}"


@line.register
def _(event: events.InterruptRequested) -> str:
    return (
        "interrupt: stopping; running probes are stopped and recorded as interrupted, the "
        "best so far is exported (Ctrl-C again to exit at once)"
    )


@line.register
def _(event: events.SearchStopped) -> str:
    return f"search stopped: {stop_reason(event)}"


def stop_reason(event: events.SearchStopped, continue_command: str = "") -> str:
    if event.kind == "budget":
        used = f"{format_duration(event.spent_s)} of the study's {format_duration(event.total_s)}"
        if event.reserve_s >= 1:
            kept = [
                what
                for seconds, what in (
                    (event.reserve_s - event.verify_s, "the confirmation round"),
                    (event.verify_s, "the loss check"),
                )
                if seconds >= 1
            ]
            used = (
                f"search {used}, the last {format_duration(event.reserve_s)} kept for "
                + " and ".join(kept or ["the confirmation round"])
            )
        text = f"budget spent ({used})"
        if event.probe_estimate_s > 0:
            text = (
                f"no time for another probe ({used}; {format_duration(event.left_s)} left, a "
                f"probe takes about {format_duration(event.probe_estimate_s)})"
            )
        if continue_command:
            # room for at least two more probes where one is what stopped the search
            more = format_duration(
                event.spent_s + event.reserve_s + max(600.0, 2 * event.probe_estimate_s)
            )
            text += f"; to go on, give a larger total: {continue_command} --budget {more}"
        return text
    if event.kind == "settled":
        return _settled_line(event)
    return {
        "max_trials": f"--max-trials {event.max_trials} reached",
        "exhausted": "every valid candidate has been evaluated",
        "interrupted": "interrupted",
        "lock_lost": "another driver took the study over ("
        + (event.holder.describe() if event.holder else "unknown")
        + ")",
    }.get(event.kind, event.kind)


@line.register
def _(event: events.ConfirmationStarted) -> str:
    return f"confirming {len(event.labels)} contender(s), interleaved: " + ", ".join(event.labels)


@line.register
def _(event: events.ConfirmationDone) -> str:
    return f"confirmation ({event.rounds} round(s), {event.seconds:.0f} s): {event.verdict}"


@line.register
def _(event: events.LossCheckStarted) -> str:
    return (
        f"verifying trial {event.trial} ({event.label}) against {event.reference_label}: "
        f"{event.reason}; {event.runs} run(s) of {event.steps} step(s) from one seed"
    )


@line.register
def _(event: events.LossCheckRunDone) -> str:
    text = f"  {event.role} {event.label}: {event.status} in {event.wall_s:.0f} s"
    return text + (f" ({event.error})" if event.error else "")


@line.register
def _(event: events.LossCheckDone) -> str:
    compared = (  # "cannot judge" compared nothing
        f"largest difference {relative_text(event.max_relative_difference)} against a "
        f"tolerance of {relative_text(event.tolerance)} there; "
        if event.tolerance > 0
        else ""
    )
    return (
        f"loss check of trial {event.trial}: {event.verdict} ({compared}{event.seconds:.0f} s)"
        + ("; set aside (--verify strict): the next best is checked" if event.set_aside else "")
    )


@line.register
def _(event: events.LossCheckInterrupted) -> str:
    return f"loss check of trial {event.trial} interrupted: nothing recorded"


def relative_text(value: float) -> str:
    """A relative difference as a percentage with two significant digits ("inf" for a
    loss that is not finite)."""
    return f"{100 * value:.2g}%" if value != float("inf") else "inf"


def _settled_line(event: events.SearchStopped) -> str:
    """What the settled search compared: the nearest open candidate's prediction against
    the best measured, beside the cost model's own error on the study's probes."""
    from autotune.run.sampler import PROMISING_MARGIN

    compared = f"no open candidate is predicted within {100 * PROMISING_MARGIN:.0f}% of the best"
    evidence = []
    if event.predicted_gap is not None:
        evidence.append(f"the nearest {100 * event.predicted_gap:.0f}% below it")
    if event.model_error is not None:
        evidence.append(
            f"the cost model's leave-one-out error on this study's {event.probes} probes "
            f"±{100 * event.model_error:.0f}%"
        )
    if evidence:
        compared += f" ({'; '.join(evidence)})"
    text = (
        f"{compared}, and the budget is short of the confirmation round's plan: its last "
        f"{format_duration(event.reserve_s)} go to confirming the best"
    )
    within = (
        event.predicted_gap is not None
        and event.model_error is not None
        and event.model_error >= event.predicted_gap
    )
    if within:
        text += "; that gap is within the model's error: a longer --budget searches on"
    return text
