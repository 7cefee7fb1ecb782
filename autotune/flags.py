"""The flags of ``autotune run``, as a user types them: the one source of their defaults.

:class:`RunFlags` drives the command line (each field is an option, its description the
help, its default the one shown), what a study stores (the flags it was started with) and
what a continued study takes back: model defaults, then the study's stored flags, then the
flags given on this command line. :meth:`RunFlags.settings` turns them into the typed
:class:`~autotune.settings.RunSettings` (units parsed, paths absolute).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune.errors import SettingsError
from autotune.settings import DEFAULT_STORAGE, RunSettings, parse_duration, parse_size

# Flags that concern one run, not what a study measures: never stored with the study.
PER_RUN = ("budget", "max_trials", "study", "storage", "inject_fault", "quiet", "retry_failed")
PER_RUN += ("ray_address",)  # the cluster one run uses; the next may use another
PER_RUN += ("shared",)  # how this driver joins the study, not what the study measures
# Flags naming files or folders: stored absolute, so a continue from elsewhere finds them.
PATHS = ("base_config", "nvme_path", "trials_dir", "script")


class RunFlags(BaseModel):
    """``autotune run``'s options (a field ``gpus_per_trial`` is the flag
    ``--gpus-per-trial``)."""

    model_config = ConfigDict(extra="forbid")

    workload: str | None = Field(
        default=None,
        description="Built-in workload (gpt-tiny, dit-s-8, llama3-8b, ...), "
        "hf:path/config.json[?seq=N&batch=N] (a local Hugging Face config, random weights), or "
        "path/to/file.py:function; a new study needs it or --script.",
    )
    script: str | None = Field(
        default=None,
        description="Your training script, unedited, as the probe; its arguments follow "
        "`--` (e.g. --script train.py -- --deepspeed ds_config.json).",
    )
    script_args: list[str] = Field(
        default_factory=list,
        description="The script's arguments, after `--`.",
        json_schema_extra={"positional": True},
    )
    script_arg: list[str] = Field(
        default_factory=list,
        description="DIMENSION=--flag: the script's own flag for micro_batch_size, "
        "gradient_accumulation_steps, activation_checkpointing, bf16 or fp16 (repeatable; "
        "the Hugging Face Trainer's flags are known).",
    )
    space: str = Field(
        default="default", description="Search space: a YAML path or a built-in name."
    )
    gpus: int = Field(
        default=1, gt=0, description="Devices the study may use (CPU ranks without GPUs)."
    )
    gpus_per_trial: int | None = Field(
        default=None, gt=0, description="Devices one probe uses (default: all of --gpus)."
    )
    vram: str = Field(
        default="auto",
        description="Memory limit per device, e.g. 80GiB, or 'auto' (the device's memory; "
        "on CPU the RAM shared by the ranks).",
    )
    global_batch: str | None = Field(
        default=None,
        description="Samples per optimizer step (default: the base config's, else the "
        "workload's), or 'auto' to search it up to --max-global-batch.",
    )
    max_global_batch: int | None = Field(
        default=None, gt=0, description="Largest global batch with --global-batch auto."
    )
    base_config: str | None = Field(
        default=None,
        description="Your DeepSpeed JSON (optimizer, scheduler ...); tuned keys override it.",
    )
    nvme_path: str | None = Field(
        default=None, description="Folder on an NVMe disk, for nvme offload candidates."
    )
    budget: str | None = Field(
        default=None,
        description="The study's total wall-clock budget: 90s, 30m, 2h, 1h30m. A new study "
        "gets 30m; a continued one keeps what is left of its own unless given a new total.",
    )
    max_trials: int | None = Field(
        default=None, gt=0, description="Stop after this many new candidates are probed."
    )
    study: str | None = Field(
        default=None,
        description="Study name (default: the workload's name); an existing one continues "
        "with the flags it was started with.",
    )
    storage: str = Field(
        default=DEFAULT_STORAGE, description="Optuna storage URL (any SQLAlchemy URL Optuna takes)."
    )
    seed: int | None = Field(default=None, description="Sampler seed.")
    executor: Literal["ray", "local"] = Field(
        default="ray", description="'ray' (Ray core tasks) or 'local' (subprocesses, no Ray)."
    )
    ray_address: str | None = Field(
        default=None,
        description="Join an existing Ray cluster: auto, HOST:PORT of its head (GCS) or "
        "ray://HOST:PORT; probes may span its nodes (default: a private Ray on this machine).",
    )
    probe_timeout: str | None = Field(
        default=None,
        description="Hard limit of one probe, e.g. 5m (default: derived from the workload).",
    )
    cold_probes: bool = Field(
        default=False,
        description="Start every probe as a new launch (as DeepSpeed's autotuner does) "
        "instead of keeping warm workers.",
    )
    no_prune: bool = Field(default=False, description="Probe even what the memory model rules out.")
    memory_margin: float = Field(
        default=0.05,
        ge=0.0,
        lt=1.0,
        description="Prune above the limit minus this share of it (0.05 = 5%).",
    )
    host_ram: str = Field(
        default="auto", description="Host RAM a node may use, e.g. 512GiB, or 'auto' (this one's)."
    )
    warmup_steps: int = Field(
        default=2, gt=0, description="Untimed optimizer steps per probe, at least."
    )
    timed_steps: int = Field(
        default=3, gt=0, description="Timed optimizer steps per probe, at least."
    )
    max_timed_steps: int = Field(
        default=20,
        gt=0,
        description="Timed steps at most; a probe stops once its spread is under 2%.",
    )
    sampler: Literal["autotune", "tpe", "gp", "random", "grid"] = Field(
        default="autotune",
        description="autotune (model-guided), tpe, gp, random, or grid (every valid candidate "
        "once).",
    )
    no_confirm: bool = Field(
        default=False,
        description="Skip the confirmation round (re-probing the top candidates, interleaved).",
    )
    no_early_stop: bool = Field(
        default=False, description="Time every probe in full, even when clearly slower."
    )
    shared: bool = Field(
        default=False,
        description="Run side by side with other drivers of this study (a database they all "
        "reach, e.g. PostgreSQL): each takes its own proposals, none probes a candidate "
        "another has, and each runs for its own --budget.",
    )
    tf32: bool = Field(
        default=False,
        description="Let fp32 matmuls use TF32 on GPUs, as your training does if it sets "
        "torch.set_float32_matmul_precision('high') (default: IEEE fp32, PyTorch's default).",
    )
    trials_dir: str = Field(
        default="trials", description="Folder for per-trial logs and the export."
    )
    retry_failed: bool = Field(
        default=False,
        description="Probe once more the candidates whose probes failed (error, timeout), "
        "e.g. after fixing what failed: autotune run --study S --retry-failed.",
    )
    quiet: bool = Field(
        default=False,
        description="Plain lines, one per event, even on a terminal (no live view).",
    )
    inject_fault: Literal["none", "oom", "error", "crash", "hang"] = Field(
        default="none",
        description="Testing only: make every probe fail this way.",
        json_schema_extra={"hidden": True},
    )

    @classmethod
    def resolve(cls, given: dict[str, Any], stored: dict[str, Any]) -> RunFlags:
        """Model defaults, then a continued study's stored flags, then the flags given;
        checked whole (units, relations, the study's name) before any file is opened."""
        given = {k: v for k, v in given.items() if v is not None and v is not False and v != []}
        values = {**inherited(stored, given), **given}
        try:
            flags = cls(**values)
        except ValueError as exc:
            raise SettingsError(_first_problem(exc)) from None
        flags.check()
        return flags

    def check(self) -> None:
        """What a field's type cannot say: units, and flags that must agree."""
        if self.budget is not None and parse_duration(self.budget) > MAX_BUDGET_S:
            raise SettingsError(
                f"--budget {self.budget}: more than {MAX_BUDGET_S // 3600} hours "
                f"({MAX_BUDGET_S // 86400} days); give a budget such as 2h or 30m"
            )
        if self.probe_timeout is not None:
            parse_duration(self.probe_timeout, flag="--probe-timeout")
        _size_or_auto(self.vram, "--vram")
        _size_or_auto(self.host_ram, "--host-ram")
        parse_global_batch(self.global_batch)
        if self.max_timed_steps < self.timed_steps:
            raise SettingsError(
                f"--max-timed-steps {self.max_timed_steps} is below --timed-steps "
                f"{self.timed_steps}; give --max-timed-steps {self.timed_steps} or more"
            )
        if self.study is not None:
            check_study_name(self.study, flag="--study")
        if self.ray_address is not None:
            from autotune.cluster import check_ray_address

            check_ray_address(self.ray_address, self.executor)
        if self.workload is not None and self.script is not None:
            raise SettingsError(
                f"--workload {self.workload} and --script {self.script}: give one of them (a "
                "workload factory or your training script)"
            )
        if self.script is not None and self.ray_address is not None:
            raise SettingsError(
                f"--script {self.script} with --ray-address: a script's probes run on this "
                "machine's ranks (torchrun); drop --ray-address"
            )
        if self.script is None and (self.script_args or self.script_arg):
            shown = " ".join(self.script_args) or " ".join(self.script_arg)
            raise SettingsError(
                f"script arguments ({shown[:80]}) without --script; give --script train.py "
                "before `--`, or drop the arguments"
            )

    def stored(self) -> dict[str, Any]:
        """What a study keeps of these flags: per-run ones left out, paths made absolute
        (a continue from another folder must find the same files), and the host."""
        flags = self.model_dump(exclude=set(PER_RUN))
        flags[HOST_KEY] = socket.gethostname()
        location, sep, function = str(flags["workload"] or "").rpartition(":")
        if sep and (location.endswith(".py") or "/" in location):
            flags["workload"] = f"{Path(location).resolve()}:{function}"
        for name in PATHS:
            if flags[name] is not None:
                flags[name] = str(Path(flags[name]).resolve())
        if Path(flags["space"]).is_file():
            flags["space"] = str(Path(flags["space"]).resolve())
        return flags

    def study_name(self) -> str:
        from autotune.workloads import workload_study_name

        if self.study:
            return self.study
        if self.script is not None:
            name, flag = Path(self.script).stem, "--script"
        elif self.workload is not None:
            name, flag = workload_study_name(self.workload), "--workload"
        else:
            raise SettingsError(
                "--workload or --script is required for a new study (e.g. --workload gpt-tiny, "
                "or --script train.py -- ITS ARGS; `autotune init train.py -- ITS ARGS` writes "
                "an autotune.yaml so that `autotune run` alone works); to continue a study, "
                "pass --study NAME"
            )
        name = re.sub(r"[^A-Za-z0-9._-]", "-", name).strip("-.")
        return check_study_name(name[:100] or "study", flag=flag)

    def settings(self) -> RunSettings:
        """The typed settings: sizes and durations parsed, 'auto' resolved later."""
        script = None
        if self.script is not None:
            from autotune.script_args import parse_script

            script = parse_script(self.script, self.script_args, self.script_arg, cwd=Path.cwd())
        workload = f"script:{script.path}" if script is not None else self.workload
        if workload is None:
            raise SettingsError(
                f"--study {self.study_name()}: no such study in {self.storage} to continue; "
                "start it with --workload W or --script train.py (and the other flags)"
            )
        return RunSettings.build(
            workload=workload,
            script=script,
            retry_failed=self.retry_failed,
            space=self.space,
            gpus=self.gpus,
            gpus_per_trial=self.gpus_per_trial,
            vram_limit_bytes=_size_or_auto(self.vram, "--vram"),
            global_batch=parse_global_batch(self.global_batch),
            max_global_batch=self.max_global_batch,
            base_config=self.base_config,
            nvme_path=self.nvme_path,
            budget_s=None if self.budget is None else parse_duration(self.budget),
            max_trials=self.max_trials,
            study_name=self.study_name(),
            storage_url=self.storage,
            seed=self.seed,
            executor=self.executor,
            ray_address=self.ray_address,
            probe_timeout_s=None
            if self.probe_timeout is None
            else parse_duration(self.probe_timeout, flag="--probe-timeout"),
            trials_dir=self.trials_dir,
            warmup_steps=self.warmup_steps,
            timed_steps=self.timed_steps,
            prune=not self.no_prune,
            warm_workers=not self.cold_probes,
            memory_margin=self.memory_margin,
            host_ram_bytes=_size_or_auto(self.host_ram, "--host-ram"),
            max_timed_steps=self.max_timed_steps,
            sampler=self.sampler,
            early_stop=not self.no_early_stop,
            confirm=not self.no_confirm,
            tf32=self.tf32,
            shared=self.shared,
        )


MAX_BUDGET_S = 30 * 24 * 3600  # a month: past it, a typo (99999h), not a plan
# A study name becomes a folder under --trials-dir and text in shell scripts: keep it plain.
STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
HOST_KEY = "_host"  # in a study's stored flags: the host it was started on
# Stored flags that name files or code: taken back only on the host that stored them, and
# only where the file is this user's (a shared database must not choose what is imported
# or where files go).
FILE_FLAGS = ("workload", "script", "space", "base_config", "nvme_path", "trials_dir")


def check_study_name(name: str, *, flag: str) -> str:
    if not STUDY_NAME.match(name):
        raise SettingsError(
            f"{flag}: study name {name!r} must be 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (it names a folder under --trials-dir)"
        )
    return name


def _names_a_file(flag: str, value: Any) -> bool:
    if value is None:
        return False
    if flag == "workload":
        return ":" in str(value)  # path/to/file.py:fn or package.module:fn: code to import
    if flag == "space":
        return Path(str(value)).suffix in (".yaml", ".yml") or "/" in str(value)
    return True


def _owned_here(value: str) -> bool:
    """The file (or the nearest folder above it that exists) belongs to this user."""
    path = Path(value.rpartition(":")[0] if ":" in value else value)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return path.stat().st_uid == os.getuid()
    except OSError:
        return False


def inherited(stored: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The stored flags a continue takes back; refuses, in one line, a stored file or code
    reference from another host or another user's file (give those flags explicitly)."""
    known = {k: v for k, v in stored.items() if k in RunFlags.model_fields and k not in PER_RUN}
    if not known:
        return {}
    same_host = stored.get(HOST_KEY) == socket.gethostname()
    foreign = [
        flag
        for flag in FILE_FLAGS
        if flag not in given
        and _names_a_file(flag, known.get(flag))
        and not (same_host and _owned_here(str(known[flag])))
    ]
    if foreign == ["trials_dir"]:
        known.pop("trials_dir")  # this host's default folder, not the stored one
    elif foreign:
        origin = stored.get(HOST_KEY) or "an unknown host"
        shown = " ".join(
            f"--{f.replace('_', '-')} {known[f]}" for f in foreign if f != "trials_dir"
        )
        raise SettingsError(
            f"this study was started on {origin} with files this run will not take from the "
            f"database ({shown}); give them explicitly to continue here, e.g. "
            + " ".join(f"--{f.replace('_', '-')} PATH" for f in foreign if f != "trials_dir")
        )
    return known


def parse_global_batch(text: str | None) -> int | str | None:
    if text is None or text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise SettingsError(f"--global-batch {text}: give a positive integer or 'auto'")
    return value


def _size_or_auto(text: str, flag: str) -> int | None:
    return None if text == "auto" else parse_size(text, flag=flag)


def _first_problem(exc: ValueError) -> str:
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return str(exc)
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else "flags"
    return f"--{name.replace('_', '-')}: {error['msg'].lower()}, got {error.get('input')!r}"
