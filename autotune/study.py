"""autotune's view of an Optuna study: storage, the study's settings, and trial records.

The driver is the only writer. A study remembers the settings that decide what was
measured (:class:`StudyConfig`, a study user attr), and every trial carries its record as
user attrs (candidate, DeepSpeed config, status, throughput, peak memory per rank, probe
wall time) plus a constraint ``peak_over_limit_bytes`` (> 0: infeasible, never best).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from autotune.candidate import Candidate
from autotune.errors import StorageError

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from autotune.protocol import ProbeResult

CONSTRAINT = "peak_over_limit_bytes"
CONFIG_ATTR = "autotune_config"
FLAGS_ATTR = "autotune_flags"  # the run flags a study was started with; a continue reuses them
METRIC = "samples_per_s"


class StudyConfig(BaseModel):
    """Settings that decide what a study measured; a study keeps them for its lifetime."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: str = Field(description="Workload reference.")
    space: dict[str, Any] = Field(description="The search-space spec, as validated.")
    accelerator: str = Field(description="cuda or cpu.")
    gpus_per_trial: int = Field(description="Ranks of every probe.")
    global_batch: int | None = Field(description="Samples per optimizer step; None: searched.")
    max_global_batch: int | None = Field(default=None, description="Cap when searched.")
    vram_limit_bytes: int = Field(description="Peak memory a rank may reach.")
    base_config: dict[str, Any] | None = Field(
        default=None, description="The user's DeepSpeed config the tuned keys are laid over."
    )
    nvme_path: str | None = Field(default=None, description="NVMe folder for nvme offload.")
    threads_per_rank: int = Field(default=1, description="OMP threads of each rank.")

    def differences(self, other: StudyConfig) -> list[str]:
        """One line per setting that differs, naming the flag that sets it."""
        mine, theirs = self.model_dump(), other.model_dump()
        lines = []
        for key in mine:
            if mine[key] == theirs[key]:
                continue
            flag = FLAG_OF_CONFIG[key]
            if key in ("space", "base_config"):  # whole documents: say that they differ
                lines.append(f"{flag}: its content differs from the study's")
            else:
                lines.append(
                    f"{flag}: study has {_show(key, mine[key])}, this run asks "
                    f"{_show(key, theirs[key])}"
                )
        return lines


# The flag (or what stands behind it) of each StudyConfig field, for error messages.
FLAG_OF_CONFIG = {
    "workload": "--workload",
    "space": "--space",
    "accelerator": "the accelerator (cuda/cpu)",
    "gpus_per_trial": "--gpus-per-trial",
    "global_batch": "--global-batch",
    "max_global_batch": "--max-global-batch",
    "vram_limit_bytes": "--vram",
    "base_config": "--base-config",
    "nvme_path": "--nvme-path",
    "threads_per_rank": "threads per rank (--gpus on a CPU machine)",
}


def _show(key: str, value: Any) -> str:
    if key == "vram_limit_bytes" and isinstance(value, int):
        from autotune.settings import format_bytes

        return format_bytes(value)
    return repr(value)


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An RDB storage; SQLite folders are created and WAL is switched on (readers such as
    optuna-dashboard then never block the driver's writes)."""
    import optuna
    import sqlalchemy.exc

    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///") :])
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.closing(sqlite3.connect(path, timeout=30)) as connection:
                connection.execute("PRAGMA journal_mode=WAL")
        except (OSError, sqlite3.Error) as exc:
            raise StorageError(
                f"--storage {url}: cannot open the SQLite file {path} ({exc}); check that "
                "the folder is writable, or pass another --storage"
            ) from None
    # How long a write waits for another process's SQLite lock before failing.
    busy_timeout_s = float(os.environ.get("AUTOTUNE_SQLITE_BUSY_TIMEOUT_S", "30"))
    engine_kwargs = (
        {"connect_args": {"timeout": busy_timeout_s}} if url.startswith("sqlite") else {}
    )
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageError(
            f"--storage {url}: cannot open ({first}); pass a reachable SQLAlchemy URL such as "
            "sqlite:///trials/autotune.db"
        ) from None


def study_names(storage: optuna.storages.BaseStorage) -> list[str]:
    return [s.study_name for s in storage.get_all_studies()]


def load_existing_study(url: str, name: str | None) -> optuna.Study:
    """A study that must exist (status, export); the error lists the ones that do."""
    import optuna

    storage = open_storage(url)
    names = study_names(storage)
    if name is None:
        if len(names) == 1:
            name = names[0]
        else:
            raise StorageError(
                f"--study: {url} holds {len(names)} studies ({', '.join(names) or 'none'}); "
                "name one with --study"
            )
    if name not in names:
        raise StorageError(
            f"--study {name}: no such study in {url}; studies there: "
            f"{', '.join(names) or 'none'} (start one with autotune run)"
        )
    return optuna.load_study(study_name=name, storage=storage)


def stored_run_flags(url: str, name: str) -> dict[str, Any]:
    """The flags study ``name`` was started with, or {} if there is no such study yet."""
    storage = open_storage(url)
    for summary in storage.get_all_studies():
        if summary.study_name == name:
            return dict(summary.user_attrs.get(FLAGS_ATTR) or {})
    return {}


def study_config(study: optuna.Study) -> StudyConfig | None:
    raw = study.user_attrs.get(CONFIG_ATTR)
    return None if raw is None else StudyConfig.model_validate(raw)


def record_result(
    study: optuna.Study,
    trial: optuna.Trial,
    candidate: Candidate,
    result: ProbeResult,
    *,
    vram_limit_bytes: int,
    ds_config: dict[str, Any],
    trial_dir: str,
) -> None:
    """Write a probe's outcome on its trial and tell Optuna.

    ok -> COMPLETE with samples/s; oom -> PRUNED and infeasible (never "failed");
    error/timeout -> FAIL. The constraint is peak - limit, positive for an OOM.
    """
    from optuna.trial import TrialState

    over_bytes = result.peak_bytes - vram_limit_bytes
    if result.status == "oom":
        over_bytes = max(over_bytes, 1)
    attrs = {
        "candidate": candidate.model_dump(mode="json"),
        "candidate_key": candidate.key,
        "label": candidate.label,
        "ds_config": ds_config,
        "status": result.status,
        "error": result.error,
        "samples_per_s": result.samples_per_s,
        "samples_per_s_min": result.samples_per_s_min,
        "samples_per_s_max": result.samples_per_s_max,
        "tokens_per_s": result.tokens_per_s,
        "step_time_s": result.step_time_s,
        "warmup_steps": result.warmup_steps,
        "step_times_s": result.step_times_s,
        "peak_bytes_per_rank": result.peak_bytes_per_rank,
        "reserved_bytes_per_rank": result.reserved_bytes_per_rank,
        "host_peak_bytes_per_rank": result.host_peak_bytes_per_rank,
        "peak_bytes": result.peak_bytes,
        "vram_limit_bytes": vram_limit_bytes,
        "probe_wall_s": result.wall_s,
        "probe_init_s": result.init_s,
        "probe_cold_start": result.cold_start,
        "probe_timed_s": result.timed_s,
        "trial_dir": trial_dir,
        "versions": result.versions,
        "feasible": result.status == "ok" and over_bytes <= 0,
    }
    if result.status != "ok":
        # the last lines of the probe's log, where a crash says what happened
        attrs["log_tail"] = "\n".join(result.log_tail.strip().splitlines()[-20:])
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    if result.stopped_early:
        trial.set_user_attr("stopped_early", True)
        trial.set_user_attr("pruned_by", "early stop: clearly slower than the best so far")
    if result.status in ("ok", "oom"):
        set_constraint(study, trial, float(over_bytes))
    if result.status == "ok" and result.stopped_early:
        # measured, feasible, but a partial measurement of a loser: never the best
        study.tell(trial, state=TrialState.PRUNED)
    elif result.status == "ok":
        study.tell(trial, result.samples_per_s)
    elif result.status == "oom":
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)


def record_pruned(
    study: optuna.Study,
    trial: optuna.Trial,
    candidate: Candidate,
    *,
    pruned_by: str,
    reason: str,
    over_bytes: float,
    attrs: dict[str, Any],
) -> None:
    """A candidate judged infeasible without a probe: PRUNED, infeasible, never failed."""
    from optuna.trial import TrialState

    values = {
        "candidate": candidate.model_dump(mode="json"),
        "candidate_key": candidate.key,
        "label": candidate.label,
        "status": "pruned",
        "pruned_by": pruned_by,
        "error": reason,
        "feasible": False,
        **attrs,
    }
    for key, value in values.items():
        trial.set_user_attr(key, value)
    set_constraint(study, trial, max(float(over_bytes), 1.0))
    study.tell(trial, state=TrialState.PRUNED)


def record_duplicate(study: optuna.Study, trial: optuna.Trial, original: FrozenTrial) -> None:
    """The sampler proposed a candidate the study already evaluated: copy, do not probe."""
    from optuna.trial import TrialState

    for key, value in original.user_attrs.items():
        trial.set_user_attr(key, value)
    trial.set_user_attr("duplicate_of", original.number)
    for key, value in original.constraints.items():
        if key == CONSTRAINT:
            set_constraint(study, trial, value)
    if original.state == TrialState.COMPLETE:
        study.tell(trial, original.value)
    else:
        study.tell(trial, state=original.state)


def record_running_duplicate(study: optuna.Study, trial: optuna.Trial, original: int) -> None:
    """Proposed while the same candidate is still being probed: nothing to copy yet, so the
    trial is closed as FAIL (samplers skip FAIL trials) and marked as a duplicate."""
    from optuna.trial import TrialState

    trial.set_user_attr("duplicate_of", original)
    trial.set_user_attr("status", "duplicate")
    study.tell(trial, state=TrialState.FAIL)


def set_constraint(study: optuna.Study, trial: optuna.Trial, value: float) -> None:
    """Optuna 5's per-key constraint, plus the legacy list that optuna-dashboard 0.21 reads
    to grey out infeasible trials (its serializer knows only the "constraints" list)."""
    trial.set_constraint(CONSTRAINT, value)
    trial_id = trial.storage.get_trial_id_from_study_id_trial_number(
        trial.storage.get_study_id_from_name(study.study_name), trial.number
    )
    trial.storage.set_trial_system_attr(trial_id, "constraints", [value])


def is_duplicate(trial: FrozenTrial) -> bool:
    return "duplicate_of" in trial.user_attrs


def is_confirmation(trial: FrozenTrial) -> bool:
    """A re-probe of an evaluated candidate in the confirmation round (confirm.py)."""
    return "confirmation_of" in trial.user_attrs


def is_repeat(trial: FrozenTrial) -> bool:
    """Not an evaluation of its own: a duplicate proposal or a confirmation probe."""
    return is_duplicate(trial) or is_confirmation(trial)
