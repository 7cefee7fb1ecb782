"""One live driver per study, held in the study's own storage.

The driver is the only writer of a study (ask/tell in one process). The lock is a study
user attr ``autotune_driver`` = host, pid, start time, token and a heartbeat that a
background thread renews every :data:`HEARTBEAT_S`. It lives in the storage rather than in
a lock file so that it works the same for drivers on different hosts sharing a PostgreSQL
study, and its heartbeat is the database's clock (``CURRENT_TIMESTAMP``), so hosts whose
clocks disagree judge it alike. A holder is dead when it stopped heart-beating for
:data:`STALE_S`, or at once when it ran on this host and its pid is gone (a driver killed
with -9); a dead holder is taken over (:attr:`DriverLock.took_over`, which the session
reports). Optuna's storage has no compare-and-swap, so acquisition writes, waits
:data:`SETTLE_S` and reads back: of two drivers starting in the same instant the later
writer wins and the other refuses; every heartbeat checks the token again.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune import events
from autotune.errors import StorageError
from autotune.events import Holder

if TYPE_CHECKING:
    import optuna
    import sqlalchemy

LOCK_ATTR = "autotune_driver"
HEARTBEAT_S = 5.0
STALE_S = 60.0
SETTLE_S = 0.5


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class LockRecord(BaseModel):
    """A driver's lock on a study, as the study's user attr :data:`LOCK_ATTR` stores it (the
    one reader and writer of that attr is :class:`DriverLock`)."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(description="Host name of the driver.")
    pid: int = Field(description="Process id of the driver on its host.")
    since: str = Field(description="When the driver started: ISO 8601 with the UTC offset.")
    heartbeat: float = Field(
        description="When the driver last renewed the lock: the database's clock, seconds "
        "since the epoch."
    )
    token: str = Field(description="The driver's own random id.")
    shared: bool = Field(description="Held beside other --shared drivers.")

    @classmethod
    def read(cls, value: Any) -> LockRecord:
        """The record as stored; one that does not parse (written by something else) reads
        as a driver that never heart-beat, so it is dead and is taken over."""
        try:
            return cls.model_validate(value)
        except ValidationError:
            return cls(host="", pid=0, since="", heartbeat=0.0, token="", shared=False)


def holder_state(holder: LockRecord | None, db_now: float) -> str:
    """'free', 'live' or 'dead' for a lock record; ``db_now`` is the database's clock in
    seconds since the epoch, as the heartbeat was written."""
    if holder is None:
        return "free"
    if db_now - holder.heartbeat > STALE_S:
        return "dead"
    if holder.host == socket.gethostname() and not _pid_alive(holder.pid):
        return "dead"
    return "live"


def holder_of(record: LockRecord, db_now: float) -> Holder:
    """The driver a lock record names, as another driver sees it; ``db_now`` as in
    :func:`holder_state`."""
    return Holder(
        host=record.host,
        pid=record.pid,
        since=record.since,
        heartbeat_age_s=max(0.0, db_now - record.heartbeat),
    )


class DatabaseClock:
    """The database server's ``CURRENT_TIMESTAMP``, in seconds since the epoch (UTC)."""

    def __init__(self, url: str) -> None:
        import sqlalchemy
        from sqlalchemy.pool import NullPool

        self._engine: sqlalchemy.Engine = sqlalchemy.create_engine(url, poolclass=NullPool)

    def now(self) -> float:
        import sqlalchemy

        with self._engine.connect() as connection:
            value = connection.execute(sqlalchemy.select(sqlalchemy.func.current_timestamp()))
            stamp = value.scalar()
        if isinstance(stamp, str):  # SQLite: "YYYY-MM-DD HH:MM:SS" in UTC
            stamp = datetime.datetime.fromisoformat(stamp)
        assert isinstance(stamp, datetime.datetime)
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=datetime.timezone.utc)
        return stamp.timestamp()

    def close(self) -> None:
        self._engine.dispose()


class DriverLock:
    """Acquire with :meth:`acquire`, renew in a thread, give back with :meth:`release`.

    An exclusive driver holds the study attr :data:`LOCK_ATTR`; a shared driver
    (``--shared``) holds its own ``autotune_driver:<token>`` beside other shared drivers.
    An exclusive driver is refused while any live driver holds the study; a shared one
    while a live exclusive driver does.

    ``on_beat`` runs in the heartbeat thread before each renewal (the tuner stores the
    budget spent so far and the Optuna heartbeats of its running trials there, so a driver
    killed with -9 loses at most one heartbeat of accounting).
    """

    def __init__(
        self,
        storage: optuna.storages.BaseStorage,
        study_name: str,
        clock: DatabaseClock,
        *,
        shared: bool = False,
        on_beat: Callable[[], None] | None = None,
        emit: events.Emit = events.ignore,
    ) -> None:
        self.study_name = study_name
        self.shared = shared
        self.on_beat = on_beat
        self.emit = emit  # a heartbeat that fails: HeartbeatNotWritten, from its thread
        self.token = uuid.uuid4().hex
        self.since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        self.lost: Holder | None = None  # the driver that took the study (heartbeat thread)
        self.took_over: Holder | None = None  # the dead holder this driver replaced, if any
        self._key = f"{LOCK_ATTR}:{self.token}" if shared else LOCK_ATTR
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._storage = storage
        self._study_id = storage.get_study_id_from_name(study_name)

    def _record(self) -> LockRecord:
        return LockRecord(
            host=socket.gethostname(),
            pid=os.getpid(),
            since=self.since,
            heartbeat=self._clock.now(),
            token=self.token,
            shared=self.shared,
        )

    def _holders(self) -> dict[str, LockRecord]:
        """Every lock record in the study: the exclusive one and the shared ones."""
        attrs = self._storage.get_study_user_attrs(self._study_id)
        return {
            key: LockRecord.read(value)
            for key, value in attrs.items()
            if (key == LOCK_ATTR or key.startswith(LOCK_ATTR + ":")) and value
        }

    def _read(self) -> LockRecord | None:
        return self._holders().get(self._key)

    def _write(self, record: LockRecord | None) -> None:
        value = record.model_dump() if record is not None else None
        self._storage.set_study_user_attr(self._study_id, self._key, value)

    def acquire(self) -> None:
        """Hold the study, or raise StorageError naming a live holder that excludes this
        driver."""
        import time

        now = self._clock.now()
        for key, holder in self._holders().items():
            state = holder_state(holder, now)
            blocking = key == LOCK_ATTR or not self.shared
            if state == "live" and blocking:
                raise StorageError(
                    f"study {self.study_name!r} is being run by another driver: "
                    f"{holder_of(holder, now).describe()}; wait for it to finish or stop it, pass "
                    "--shared to every driver to run them side by side, or pass --study "
                    "NEW_NAME to start a separate study"
                )
            if state == "dead":
                self.took_over = holder_of(holder, now)
                self._storage.set_study_user_attr(self._study_id, key, None)
        self._write(self._record())
        time.sleep(SETTLE_S)
        now_holder = self._read()
        if now_holder is None or now_holder.token != self.token:
            other = (
                holder_of(now_holder, self._clock.now()).describe()
                if now_holder is not None
                else "its lock already released"
            )
            raise StorageError(
                f"study {self.study_name!r} was taken by another driver starting at the same "
                f"time ({other}); pass --study NEW_NAME to start a separate study"
            )
        self._thread = threading.Thread(target=self._beat, name="autotune-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                holder = self._read()
                if holder is not None and holder.token != self.token:
                    self.lost = holder_of(holder, self._clock.now())
                    return
                if self.on_beat is not None:
                    self.on_beat()
                self._write(self._record())
            except Exception as exc:  # noqa: BLE001 - the main loop reports storage faults
                self.emit(events.HeartbeatNotWritten(type(exc).__name__, str(exc)))

    def release(self) -> None:
        """Stop heart-beating and clear the record if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=HEARTBEAT_S + 5)
        try:
            holder = self._read()
            if holder is not None and holder.token == self.token:
                self._write(None)
        except Exception:  # noqa: BLE001 - a dead storage leaves a lock that goes stale
            pass
