"""The study's driver lock tells what it does as typed events: the dead driver it took the
study over from, a heartbeat it could not write; the CLI's renderer words them."""

from __future__ import annotations

import time

import optuna
import pytest

from autotune import events
from autotune.cli._render import line
from autotune.study import _driver_lock as lock
from autotune.study._driver_lock import DriverLock, Holder

NOW_S = 1_000_000.0


class FixedClock:
    """The database's clock, stopped at ``NOW_S``."""

    def now(self) -> float:
        return NOW_S

    def close(self) -> None:
        pass


@pytest.fixture
def storage(monkeypatch: pytest.MonkeyPatch) -> optuna.storages.BaseStorage:
    monkeypatch.setattr(lock, "SETTLE_S", 0.0)
    monkeypatch.setattr(lock, "HEARTBEAT_S", 0.02)
    memory = optuna.storages.InMemoryStorage()
    optuna.create_study(storage=memory, study_name="s")
    return memory


def test_a_dead_holder_is_taken_over_and_named_with_its_fields(
    storage: optuna.storages.BaseStorage,
) -> None:
    study_id = storage.get_study_id_from_name("s")
    dead = {
        "host": "elsewhere",
        "pid": 4242,
        "since": "2025-01-02T03:04:05+00:00",
        "heartbeat": NOW_S - 120,  # past STALE_S: dead
        "token": "old",
        "shared": False,
    }
    storage.set_study_user_attr(study_id, lock.LOCK_ATTR, dead)
    driver = DriverLock(storage, "s", FixedClock())  # type: ignore[arg-type]
    driver.acquire()
    try:
        assert driver.took_over == Holder("elsewhere", 4242, "2025-01-02T03:04:05+00:00", 120.0)
        event = events.DriverTakenOver("s", driver.took_over)
        assert line(event) == (
            "taking over study 's' from a stopped driver: pid 4242 on host elsewhere, running "
            "since 2025-01-02T03:04:05+00:00 (last heartbeat 120 s ago)"
        )
    finally:
        driver.release()


def test_a_heartbeat_that_fails_is_told_as_an_event(
    storage: optuna.storages.BaseStorage,
) -> None:
    told: list[events.Event] = []

    def failing_beat() -> None:
        raise OSError("disk full")

    driver = DriverLock(storage, "s", FixedClock(), on_beat=failing_beat, emit=told.append)  # type: ignore[arg-type]
    driver.acquire()
    try:
        deadline = time.monotonic() + 10
        while not told and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        driver.release()
    assert told and told[0] == events.HeartbeatNotWritten("OSError", "disk full")
    assert line(told[0]) == "warning: heartbeat not written (OSError: disk full)"
    assert driver.took_over is None


def test_a_driver_whose_study_is_taken_knows_by_whom_and_says_so(
    storage: optuna.storages.BaseStorage,
) -> None:
    driver = DriverLock(storage, "s", FixedClock())  # type: ignore[arg-type]
    driver.acquire()
    try:
        study_id = storage.get_study_id_from_name("s")
        other = {
            "host": "other-host",
            "pid": 77,
            "since": "2025-01-02T03:04:05+00:00",
            "heartbeat": NOW_S - 3,
            "token": "theirs",
            "shared": False,
        }
        storage.set_study_user_attr(study_id, lock.LOCK_ATTR, other)
        deadline = time.monotonic() + 10
        while driver.lost is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        driver.release()
    assert driver.lost == Holder("other-host", 77, "2025-01-02T03:04:05+00:00", 3.0)
    stopped = events.SearchStopped("lock_lost", holder=driver.lost)
    assert line(stopped) == (
        "search stopped: another driver took the study over (pid 77 on host other-host, "
        "running since 2025-01-02T03:04:05+00:00 (last heartbeat 3 s ago))"
    )
    assert line(events.SearchStopped("max_trials", max_trials=4)) == (
        "search stopped: --max-trials 4 reached"
    )


def test_a_lock_record_that_does_not_parse_is_taken_over(
    storage: optuna.storages.BaseStorage,
) -> None:
    study_id = storage.get_study_id_from_name("s")
    storage.set_study_user_attr(study_id, lock.LOCK_ATTR, {"host": "x", "heartbeat": "soon"})
    driver = DriverLock(storage, "s", FixedClock())  # type: ignore[arg-type]
    driver.acquire()
    try:
        assert driver.took_over is not None and driver.took_over.pid == 0
        stored = storage.get_study_user_attrs(study_id)[lock.LOCK_ATTR]
        assert lock.LockRecord.model_validate(stored).token == driver.token
    finally:
        driver.release()
    assert storage.get_study_user_attrs(study_id)[lock.LOCK_ATTR] is None
