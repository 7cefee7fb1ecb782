"""What a run tells its caller while it works: typed events, rendered by the CLI.

The library never formats log lines; the tuner emits these and the CLI turns them into
plain lines (a pipe, CI) or a live view (a terminal). Each event is plain data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from autotune.protocol import ProbeResult


@dataclass(frozen=True)
class Event:
    """Base of every event."""


@dataclass(frozen=True)
class OpBuildStarted(Event):
    """DeepSpeed's ``op`` is not built for this environment: compiling it starts."""

    op: str


@dataclass(frozen=True)
class OpBuildWaiting(Event):
    """Another process is building or loading ``op``: this one waits for its lock."""

    op: str


@dataclass(frozen=True)
class OpBuildFinished(Event):
    """``op`` was compiled in ``seconds`` and is cached from now on."""

    op: str
    seconds: float


@dataclass(frozen=True)
class BuildLockCleared(Event):
    """A process killed while building ``op`` left torch's build lock; it was removed."""

    op: str


@dataclass(frozen=True)
class OpUnavailable(Event):
    """An optional op does not build here, and what the run does without it.

    ``fallback``: ``torch_adam`` (FusedAdam: the probes step with torch's Adam) or
    ``no_nvme`` (async I/O: NVMe offload cannot be used)."""

    op: str
    cause: str  # the build error's first line
    log_dir: str  # the op's build folder, with the compiler's log
    fallback: Literal["torch_adam", "no_nvme"]


@dataclass(frozen=True)
class OpsBuilt(Event):
    """The ops this run compiled before its first probe, once per environment; the
    budget's clock leaves their ``seconds`` out."""

    ops: tuple[str, ...]
    seconds: float


@dataclass(frozen=True)
class Holder:
    """A driver that holds (or held) the study, as another driver sees it (built by
    :mod:`autotune.study._driver_lock` from its lock record)."""

    host: str
    pid: int
    since: str  # when it started, ISO 8601 with the UTC offset
    heartbeat_age_s: float  # by the database's clock

    def describe(self) -> str:
        """One phrase: errors name the holder with it, and so does the CLI."""
        return (
            f"pid {self.pid} on host {self.host}, running since {self.since} (last heartbeat "
            f"{self.heartbeat_age_s:.0f} s ago)"
        )


@dataclass(frozen=True)
class DriverTakenOver(Event):
    """This run took the study over from a driver that stopped without releasing it."""

    study_name: str
    holder: Holder


@dataclass(frozen=True)
class HeartbeatNotWritten(Event):
    """The driver lock's heartbeat failed once (the main loop reports lasting storage
    faults); ``error_type`` and ``error`` are the exception's class name and text."""

    error_type: str
    error: str


@dataclass(frozen=True)
class CostModelCalibrated(Event):
    """This CPU's matmul rate per precision, the cost model's compute prior."""

    threads_per_rank: int
    flops_per_s: dict[str, float]


@dataclass(frozen=True)
class TrialsRecovered(Event):
    """Trials a stopped driver left running, now failed; each is probed again once."""

    interrupted: list[int]
    retries: int


@dataclass(frozen=True)
class FailedRequeued(Event):
    """``--retry-failed``: the failed trials whose candidates are queued to be probed once
    more (empty: the study has none to retry)."""

    trial_numbers: list[int]


@dataclass(frozen=True)
class RunStarted(Event):
    study_name: str
    evaluated_before: int
    valid_candidates: int
    budget_total_s: float
    spent_before_s: float
    left_s: float
    probe_timeout_s: float


@dataclass(frozen=True)
class CandidatesScreened(Event):
    """Unevaluated candidates the memory model rules out before sampling."""

    screened: int
    unevaluated: int
    vram_limit_bytes: int


@dataclass(frozen=True)
class ProbeStarted(Event):
    trial: int | None  # None: a confirmation re-probe (not a trial of its own)
    label: str
    reprobe_of: int | None = None  # a confirmation re-probe: the trial it measures again


@dataclass(frozen=True)
class ProbeProgress(Event):
    """How far a running probe is: its optimizer steps so far, in warm-up or timed."""

    trial: int | None
    label: str
    phase: str
    steps: int


@dataclass(frozen=True)
class ProbeFinished(Event):
    trial: int | None
    label: str
    result: ProbeResult
    vram_limit_bytes: int
    log_path: str
    # why a probe that ran (ok) is infeasible: its device peak over the limit, a node's host
    # memory over --host-ram; empty when within them or not judged (a confirmation re-probe)
    over_limits: str = ""


@dataclass(frozen=True)
class CandidatePruned(Event):
    trial: int
    label: str
    reason: str


@dataclass(frozen=True)
class InterruptRequested(Event):
    """The first Ctrl-C: probes are stopped, the best so far is exported."""


@dataclass(frozen=True)
class SearchStopped(Event):
    """Why the search asked for no more candidates: its budget is spent, ``--max-trials``
    reached, every candidate evaluated, the run interrupted, another driver took the
    study (``holder``), or ``settled``: on a budget short of the confirmation round's plan,
    no open candidate is predicted near the best (the rest, ``reserve_s``, goes to the
    round)."""

    kind: Literal["budget", "max_trials", "exhausted", "interrupted", "lock_lost", "settled"]
    max_trials: int | None = None
    holder: Holder | None = None
    spent_s: float = 0.0
    total_s: float = 0.0
    reserve_s: float = 0.0
    verify_s: float = 0.0  # the part of reserve_s held for the loss check (--verify)
    # budget: what the search had left and the next probe's expected time, where the stop
    # was that the probe would not fit (0: the budget was spent)
    left_s: float = 0.0
    probe_estimate_s: float = 0.0
    # settled: how far below the best the nearest open candidate is predicted, and the cost
    # model's leave-one-out error on the study's probes (autotune.run.sampler.Settling)
    predicted_gap: float | None = None
    model_error: float | None = None
    probes: int = 0


@dataclass(frozen=True)
class ConfirmationStarted(Event):
    labels: list[str]


@dataclass(frozen=True)
class BudgetUpdated(Event):
    """The study's clock after each result: what is spent, what the search holds back for
    the confirmation round and the loss check (``reserve_s``, of which ``verify_s`` is the
    loss check's) and for the run's finish (``finish_s``: closing
    workers, deciding, exporting), and what it expects the next probe to take."""

    spent_s: float
    total_s: float
    reserve_s: float
    probe_estimate_s: float
    finish_s: float = 0.0
    verify_s: float = 0.0


@dataclass(frozen=True)
class Standing:
    """One contender of the confirmation round as it stands."""

    trial: int
    label: str
    estimate: float  # samples/s, the round's estimate (see autotune.study.confirmation)
    half_width: float  # its 95% interval
    probes: int


@dataclass(frozen=True)
class ConfirmationProgress(Event):
    """The round's standings after a re-probe, leader first."""

    standings: list[Standing]


@dataclass(frozen=True)
class ConfirmationDone(Event):
    """The round decided: its rounds, its seconds and its verdict in words (the winner, the
    runners-up and why; see :mod:`autotune.study.confirmation`)."""

    rounds: int
    seconds: float
    verdict: str


@dataclass(frozen=True)
class LossCheckStarted(Event):
    """The loss check of ``trial`` starts: its reference and why, and the runs' length."""

    trial: int
    label: str
    reference_label: str
    reason: str
    steps: int
    runs: int  # loss runs launched (the reference twice, and the trial)


@dataclass(frozen=True)
class LossCheckRunDone(Event):
    """One loss run of the check ended (``role``: reference, reference repeat,
    winner)."""

    role: str
    label: str
    status: str
    error: str
    wall_s: float


@dataclass(frozen=True)
class LossCheckDone(Event):
    """The check's verdict in words (see :mod:`autotune.study.loss_comparison`)."""

    trial: int
    verdict: str
    max_relative_difference: float
    tolerance: float
    seconds: float
    set_aside: bool = False  # --verify strict: it differs, the next best is checked


@dataclass(frozen=True)
class LossCheckInterrupted(Event):
    """The check of ``trial`` was stopped (Ctrl-C) before its runs ended: nothing stored."""

    trial: int


@dataclass(frozen=True)
class RunFinished(Event):
    """The run's outcome; ``summary`` is a :class:`autotune.run._tuner.RunSummary`."""

    summary: object
    interrupted_probes: list[int] = field(default_factory=list)


Emit = Callable[[Event], None]


def ignore(event: Event) -> None:
    """An ``emit`` that drops everything (library use, tests)."""
