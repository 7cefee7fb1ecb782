"""The driver's hold on its study: storage, the one-driver lock, heartbeats, Ctrl-C, and
storage faults turned into one line.

- The study is opened on an Optuna ``RDBStorage`` with heartbeats on: the driver records a
  heartbeat for each trial it is probing, and a trial whose heartbeat is older than
  :data:`~autotune.study._driver_lock.STALE_S` by the database's clock is failed by Optuna's
  ``fail_stale_trials``, whose ``RetryHeartbeatStaleTrialCallback`` queues it once more.
  With the lock held, a trial still running belongs to a driver that is gone: it is failed
  and queued the same way at once.
- Shared drivers (``--shared``) hold the study side by side; then only trials whose
  heartbeat went stale are failed, never a live driver's.
- Ctrl-C: the first sets :attr:`DriverSession.stopping` (the tuner stops probes, records
  them interrupted and exports); the second runs the caller's ``on_second_interrupt`` (the
  CLI's kills every probe group and exits at once), and without one raises
  KeyboardInterrupt.
"""

from __future__ import annotations

import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from autotune import events
from autotune.errors import StorageError
from autotune.events import Holder
from autotune.settings import mask_url
from autotune.study import STALE_S, DatabaseClock, DriverLock

if TYPE_CHECKING:
    import optuna

    from autotune.run._resolved_run import ResolvedRun

HEARTBEAT_S = 5
MAX_RETRIES = 1  # an interrupted candidate is probed again once


def storage_errors() -> tuple[type[BaseException], ...]:
    import optuna
    import sqlalchemy.exc

    return (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError)


def first_line(exc: BaseException) -> str:
    """The root cause's first line (Optuna wraps SQLAlchemy's error, which wraps the
    driver's, e.g. sqlite3's "database is locked")."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def retry_callback() -> Callable[[optuna.Study, optuna.trial.FrozenTrial], None]:
    from optuna.storages import RetryHeartbeatStaleTrialCallback

    return RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)


class DriverSession:
    """Open with ``with``: the study, held by this driver until the block ends."""

    def __init__(
        self,
        resolved: ResolvedRun,
        *,
        sampler: optuna.samplers.BaseSampler,
        run_flags: dict[str, Any],
        emit: events.Emit,
        on_beat: Callable[[], None],
        on_second_interrupt: Callable[[], None] | None = None,
    ) -> None:
        self.resolved = resolved
        self.stopping = False
        self.stop_requested = threading.Event()  # set with stopping, for waits to poll
        self._on_second_interrupt = on_second_interrupt
        self._sampler = sampler
        self._run_flags = run_flags
        self._emit = emit
        self._on_beat = on_beat
        self._lock: DriverLock | None = None
        self._clock: DatabaseClock | None = None
        self._previous_handler: Any = None
        self.study: optuna.Study
        self.storage: optuna.storages.BaseStorage

    @property
    def lost(self) -> Holder | None:
        """The driver that took the study over, if one did (heartbeat thread)."""
        return self._lock.lost if self._lock is not None else None

    def __enter__(self) -> DriverSession:
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            with self.storage_faults():
                self._open()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.release()
        if self._clock is not None:
            self._clock.close()
        if self._previous_handler is not None:
            signal.signal(signal.SIGINT, self._previous_handler)

    def _open(self) -> None:
        import optuna

        from autotune import training_goal
        from autotune.study import open_storage, store_dropped_backends, store_start, study_config

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        # ask/tell with heartbeats: the driver records them itself (see module docstring)
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
        url = self.resolved.settings.storage.storage_url
        self.storage = open_storage(
            url, heartbeat_s=HEARTBEAT_S, grace_s=STALE_S, on_stale=retry_callback()
        )
        self.study = optuna.create_study(
            study_name=self.resolved.study_name,
            storage=self.storage,
            sampler=self._sampler,
            direction="maximize",
            load_if_exists=True,
        )
        stored = study_config(self.study)
        if stored is None:
            store_start(self.study, self.resolved.config, self._run_flags)
        elif stored != self.resolved.config:
            diffs = "; ".join(stored.differences(self.resolved.config))
            raise StorageError(
                f"study {self.resolved.study_name!r} was measured with other settings: {diffs}; "
                "drop those flags to continue it with its own, or add --study NEW_NAME to "
                "start a new study with them"
            )
        training_goal.store(self.study, self.resolved.goal)
        store_dropped_backends(self.study, self.resolved.space.dropped_backends)
        self._clock = DatabaseClock(url)
        self._lock = DriverLock(
            self.storage,
            self.resolved.study_name,
            self._clock,
            shared=self.resolved.settings.storage.shared,
            on_beat=self._on_beat,
            emit=self._emit,
        )
        self._lock.acquire()
        if self._lock.took_over:
            self._emit(events.DriverTakenOver(self.resolved.study_name, self._lock.took_over))

    def recover(self) -> list[int]:
        """Fail the trials a stopped driver left running and queue each once more (Optuna's
        retry callback); return their numbers."""
        import optuna
        from optuna.trial import TrialState

        def running() -> list[optuna.trial.FrozenTrial]:
            return self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))

        before = {t.number for t in running()}
        optuna.storages.fail_stale_trials(self.study)  # stale by the database's clock
        if self.resolved.settings.storage.shared:
            # other live drivers' trials are running too: only stale ones were theirs to lose
            return sorted(before - {t.number for t in running()})
        callback = retry_callback()
        for trial in running():  # the lock is ours alone: whoever ran these is gone
            self.study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
            callback(self.study, self.study.get_trials(deepcopy=False)[trial.number])
        return sorted(before)

    def requeue(self, trial: optuna.Trial) -> None:
        """Queue an interrupted trial's candidate once more, as a stale trial's would be."""
        callback = retry_callback()
        callback(self.study, self.study.get_trials(deepcopy=False)[trial.number])

    def record_heartbeats(self, trials: list[optuna.Trial]) -> None:
        """Optuna's heartbeat of each trial being probed (from the lock's heartbeat)."""
        from autotune.study import trial_id

        for trial in trials:
            self.storage.record_heartbeat(trial_id(trial))  # type: ignore[attr-defined]

    def _on_sigint(self, signum: int, frame: object) -> None:
        """First Ctrl-C: stop asking, the tuner stops probes and exports. Second: the
        caller's ``on_second_interrupt``, then (if it returned, or without one)
        KeyboardInterrupt."""
        if self.stopping:
            if self._on_second_interrupt is not None:
                self._on_second_interrupt()
            raise KeyboardInterrupt
        self.stopping = True
        self.stop_requested.set()
        self._emit(events.InterruptRequested())

    @contextmanager
    def storage_faults(self) -> Iterator[None]:
        """A storage or file-system fault becomes one StorageError line; every trial
        recorded before it stays in the storage."""
        try:
            yield
        except storage_errors() as exc:
            raise StorageError(
                f"the storage {mask_url(self.resolved.settings.storage.storage_url)} failed "
                f"({mask_url(first_line(exc))}); every trial recorded before is kept; fix it "
                "(another process holding the "
                f"database locked?), then continue with {continue_command(self.resolved)}"
            ) from None
        except OSError as exc:
            raise StorageError(
                f"cannot write the run's files ({first_line(exc)}); every trial recorded "
                "before is kept; free space or fix the folder, then continue with "
                f"{continue_command(self.resolved)}"
            ) from None


def continue_command(resolved: ResolvedRun) -> str:
    from autotune.settings import DEFAULT_STORAGE

    command = f"autotune run --study {resolved.study_name}"
    if resolved.settings.storage.storage_url != DEFAULT_STORAGE:
        command += f" --storage {mask_url(resolved.settings.storage.storage_url)}"
    return command
