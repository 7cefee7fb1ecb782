"""autotune's view of an Optuna study: its storage and the settings it was started with.

A study remembers the settings that decide what was measured (:class:`StudyConfig`), the
flags it was started with (a continue reuses them), the candidates the memory model
ruled out before sampling and the backends its space lists that its latest run could not
train with (:class:`~autotune.space.DroppedBackend`), each a study user attr read and
written only here. Trial records are :mod:`autotune.study.records`; the budget, the
confirmation verdict, the best trial and the driver lock keep their study attrs in
:mod:`autotune.run.budget`, :mod:`autotune.study.confirmation`, :mod:`autotune.study.best`
and :mod:`autotune.study._driver_lock`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from autotune.errors import StorageError
from autotune.flag import flag_of, setting_field
from autotune.script_config import ScriptConfig
from autotune.settings import RunSettings, mask_url

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    import optuna
    from optuna.trial import FrozenTrial

    from autotune.space import DroppedBackend

CONFIG_ATTR = "autotune_config"
FLAGS_ATTR = "autotune_flags"  # the run flags a study was started with; a continue reuses them
SCREENED_ATTR = "autotune_screened"  # keys the memory model ruled out before sampling
# The space's backends the latest run dropped (DroppedBackend records); none: []
DROPPED_BACKENDS_ATTR = "autotune_dropped_backends"
METRIC = "samples_per_s"


@dataclass(frozen=True)
class SetBy:
    """What sets a :class:`StudyConfig` field, for the line that says it differs: a run
    setting (its flag taken from the setting's own declaration), and words where no one
    flag sets it or the flag needs saying how."""

    setting: str | None = None
    words: str = ""

    def text(self) -> str:
        if self.setting is None:
            return self.words
        field = setting_field(RunSettings, self.setting)
        flag = flag_of(field) if field is not None else None
        option = flag.option(self.setting) if flag else self.setting
        return f"{option} ({self.words})" if self.words else option


class StudyConfig(BaseModel):
    """Settings that decide what a study measured, resolved against the hardware, the
    workload and the space; a study keeps them for its lifetime."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: Annotated[str, SetBy("workload")] = Field(description="Workload reference.")
    space: Annotated[dict[str, Any], SetBy("space")] = Field(
        description="The search-space spec, as validated."
    )
    accelerator: Annotated[str, SetBy(words="the accelerator (cuda/cpu)")] = Field(
        description="cuda or cpu."
    )
    gpus_per_trial: Annotated[int, SetBy("gpus_per_trial")] = Field(
        description="Ranks of every probe (the largest if searched)."
    )
    world_sizes: Annotated[list[int], SetBy("world_sizes", "the world sizes searched")] = Field(
        default_factory=list,
        description="World sizes searched (--gpus 1-8); empty: every probe at gpus_per_trial.",
    )
    global_batch: Annotated[int | None, SetBy("global_batch")] = Field(
        description="Samples per optimizer step; None: searched."
    )
    max_global_batch: Annotated[int | None, SetBy("max_global_batch")] = Field(
        default=None, description="Cap when searched."
    )
    vram_limit_bytes: Annotated[int, SetBy("vram_limit_bytes")] = Field(
        description="Peak memory a rank may reach."
    )
    base_config: Annotated[dict[str, Any] | None, SetBy("base_config")] = Field(
        default=None, description="The user's DeepSpeed config the tuned keys are laid over."
    )
    nvme_path: Annotated[str | None, SetBy("nvme_path")] = Field(
        default=None, description="NVMe folder for nvme offload."
    )
    threads_per_rank: Annotated[int, SetBy(words="threads per rank (--gpus on a CPU machine)")] = (
        Field(default=1, description="OMP threads of each rank.")
    )
    float32_matmul_precision: Annotated[str, SetBy("tf32")] = Field(
        default="highest",
        description="torch.set_float32_matmul_precision of the probes: 'highest' (IEEE fp32, "
        "PyTorch's default) or 'high' (TF32 on GPUs that have it).",
    )
    script: Annotated[
        ScriptConfig | None,
        SetBy(words="--script (its arguments, --script-arg, the folder it runs in)"),
    ] = Field(
        default=None,
        description="The user's training script that is the probe: its file, its arguments, "
        "the folder it runs in and how the candidate's values reach it.",
    )

    @property
    def ranks_text(self) -> str:
        """Every probe's ranks, or the world sizes searched: "2", "1, 2, 4 (searched)"."""
        if self.world_sizes:
            return f"{', '.join(map(str, self.world_sizes))} (searched)"
        return str(self.gpus_per_trial)

    def differences(self, other: StudyConfig) -> list[str]:
        """One line per setting that differs, naming the flag that sets it."""
        mine, theirs = self.model_dump(), other.model_dump()
        lines = []
        for key in mine:
            if mine[key] == theirs[key]:
                continue
            field = type(self).model_fields[key]
            flag = next(item for item in field.metadata if isinstance(item, SetBy)).text()
            if key in ("space", "base_config", "script"):  # documents: say that they differ
                lines.append(f"{flag}: its content differs from the study's")
            else:
                lines.append(
                    f"{flag}: study has {_show(key, mine[key])}, this run asks "
                    f"{_show(key, theirs[key])}"
                )
        return lines


def _show(key: str, value: Any) -> str:
    if key == "vram_limit_bytes" and isinstance(value, int):
        from autotune.units import format_bytes

        return format_bytes(value)
    return repr(value)


def open_storage(
    url: str,
    *,
    heartbeat_s: int | None = None,
    grace_s: float | None = None,
    on_stale: Callable[[optuna.Study, FrozenTrial], None] | None = None,
) -> optuna.storages.RDBStorage:
    """An RDB storage; SQLite folders are created and WAL is switched on (readers such as
    optuna-dashboard then never block the driver's writes). A driver opens it with
    heartbeats (``heartbeat_s``; a running trial silent for ``grace_s`` is stale and handed
    to ``on_stale``); readers (status, export) without."""
    import optuna
    import sqlalchemy.exc

    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.closing(sqlite3.connect(path, timeout=30)) as connection:
                connection.execute("PRAGMA journal_mode=WAL")
        except (OSError, sqlite3.Error) as exc:
            raise _sqlite_error(url, path, str(exc)) from None
    # How long a write waits for another process's SQLite lock before failing.
    busy_timeout_s = float(os.environ.get("AUTOTUNE_SQLITE_BUSY_TIMEOUT_S", "30"))
    engine_kwargs = (
        {"connect_args": {"timeout": busy_timeout_s}} if url.startswith("sqlite") else {}
    )
    try:
        return optuna.storages.RDBStorage(
            url,
            engine_kwargs=engine_kwargs,
            heartbeat_interval=heartbeat_s,
            grace_period=None if grace_s is None else int(grace_s),
            heartbeat_stale_trial_callback=on_stale,
        )
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as exc:
        raise _unreachable(url, exc) from None


def check_reachable(url: str) -> None:
    """Fail with one line (:class:`StorageError`) if the storage at ``url`` cannot be
    opened, writing nothing: a SQLite file that exists must open; one that does not yet must
    have a folder that could be created and written
    (:func:`autotune.writable.check_folder_writable`); any other URL must connect."""
    import sqlalchemy
    import sqlalchemy.exc

    from autotune.writable import check_folder_writable, why_not_writable

    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        try:
            if path.exists():
                read_only = f"{path.resolve().as_uri()}?mode=ro"
                with contextlib.closing(sqlite3.connect(read_only, uri=True)) as c:
                    c.execute("PRAGMA schema_version")
            else:
                check_folder_writable(path.parent)
        except (OSError, sqlite3.Error) as exc:
            why = why_not_writable(exc) if isinstance(exc, OSError) else str(exc)
            raise _sqlite_error(url, path, why) from None
        return
    try:
        engine = sqlalchemy.create_engine(url)
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as exc:
        raise _unreachable(url, exc) from None


def _sqlite_error(url: str, path: Path, why: str) -> StorageError:
    return StorageError(
        f"--storage {mask_url(url)}: cannot open the SQLite file {path} ({why}); check "
        "that the folder is writable, or pass another --storage"
    )


def _unreachable(url: str, exc: Exception) -> StorageError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return StorageError(
        f"--storage {mask_url(url)}: cannot open ({mask_url(first)}); pass a reachable "
        "SQLAlchemy URL such as sqlite:///trials/autotune.db"
    )


def study_names(storage: optuna.storages.BaseStorage) -> list[str]:
    return [s.study_name for s in storage.get_all_studies()]


def load_existing_study(url: str, name: str | None) -> optuna.Study:
    """A study that must exist (status, export); the error lists the ones that do. An
    SQLite file that does not exist is not created by asking."""
    import optuna

    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        raise StorageError(
            f"--study {name or ''}: no such study in {mask_url(url)} (there is no database "
            "file there); pass the --storage of a study, or start one with autotune run"
        )
    storage = open_storage(url)
    names = study_names(storage)
    if name is None:
        if len(names) == 1:
            name = names[0]
        else:
            raise StorageError(
                f"--study: {mask_url(url)} holds {len(names)} studies "
                f"({', '.join(names) or 'none'}); name one with --study"
            )
    if name not in names:
        raise StorageError(
            f"--study {name}: no such study in {mask_url(url)}; studies there: "
            f"{', '.join(names) or 'none'} (start one with autotune run)"
        )
    return optuna.load_study(study_name=name, storage=storage)


def stored_run_flags(url: str, name: str) -> dict[str, Any]:
    """The flags study ``name`` was started with, or {} if there is no such study yet (an
    SQLite file that does not exist yet is not created by asking). A memory limit the study
    took from its host (``vram: auto``) comes back as the limit it was measured under, so
    that it continues on a host whose memory differs by a page."""
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        return {}
    storage = open_storage(url)
    for summary in storage.get_all_studies():
        if summary.study_name == name:
            flags = dict(summary.user_attrs.get(FLAGS_ATTR) or {})
            limit = (summary.user_attrs.get(CONFIG_ATTR) or {}).get("vram_limit_bytes")
            if flags.get("vram") == "auto" and limit:
                flags["vram"] = str(limit)
            return flags
    return {}


def study_config(study: optuna.Study) -> StudyConfig | None:
    """The settings the study was started with (None: not a study autotune made)."""
    from pydantic import ValidationError

    raw = study.user_attrs.get(CONFIG_ATTR)
    if raw is None:
        return None
    try:
        return StudyConfig.model_validate(raw)
    except ValidationError as exc:
        where = ".".join(str(part) for part in exc.errors()[0]["loc"]) or "settings"
        raise StorageError(
            f"study {study.study_name!r}: its stored settings ({CONFIG_ATTR}.{where}) are not "
            "what this autotune reads (edited, or written by another version); start a new "
            "study with --study NEW_NAME"
        ) from None


def store_start(study: optuna.Study, config: StudyConfig, flags: dict[str, Any]) -> None:
    """A new study: what it measures, and the flags a continue takes back. The best is
    stored first (empty for now): optuna-dashboard lists study attrs in that order, and the
    decision belongs on its first page."""
    from autotune.study.best import BEST_ATTR

    study.set_user_attr(BEST_ATTR, None)
    study.set_user_attr(CONFIG_ATTR, config.model_dump(mode="json"))
    study.set_user_attr(FLAGS_ATTR, flags)
    study.set_metric_names([METRIC])


def screened_keys(study: optuna.Study) -> set[str]:
    return set(study.user_attrs.get(SCREENED_ATTR) or [])


def store_screened(study: optuna.Study, keys: list[str]) -> None:
    study.set_user_attr(SCREENED_ATTR, keys)


def store_dropped_backends(study: optuna.Study, dropped: Iterable[DroppedBackend]) -> None:
    """The backends this run's space dropped. They replace an earlier run's: a continued
    run binds the space again, and on another torch it may keep what the first dropped."""
    study.set_user_attr(DROPPED_BACKENDS_ATTR, [d.model_dump(mode="json") for d in dropped])


def dropped_backends(study: optuna.Study) -> list[DroppedBackend]:
    """The backends the study's latest run dropped from its space, and why ([] for a study
    stored before autotune kept them)."""
    from pydantic import ValidationError

    from autotune.space import DroppedBackend

    raw = study.user_attrs.get(DROPPED_BACKENDS_ATTR) or []
    try:
        return [DroppedBackend.model_validate(entry) for entry in raw]
    except ValidationError:
        raise StorageError(
            f"study {study.study_name!r}: its stored dropped backends ({DROPPED_BACKENDS_ATTR}) "
            "are not what this autotune reads (edited, or written by another version); start "
            "a new study with --study NEW_NAME"
        ) from None
