"""The flags of ``autotune run``, as a user types them.

:class:`RunFlags` drives the command line (each field is an option, its description the
help, its default the one shown), what a study stores (the flags it was started with) and
what a continued study takes back (:mod:`autotune.cli._stored_flags`): model defaults, then the
study's stored flags, then the flags given on this command line. :meth:`RunFlags.settings`
turns them into the typed :class:`~autotune.settings.RunSettings` (units parsed, paths
absolute), which holds every default: a flag takes its default from its setting.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from autotune.cli._flag_values import (
    check_study_name,
    first_problem,
    parse_global_batch,
    size_or_auto,
)
from autotune.cli._stored_flags import HOST_KEY, PER_RUN, inherited
from autotune.errors import SettingsError
from autotune.settings import DEFAULT_BUDGET_S, RunSettings, parse_duration
from autotune.timing import format_duration

if TYPE_CHECKING:
    from autotune.training_goal import TrainingGoal

# Flags of the training goal (autotune.training_goal): given together, they replace a
# continued study's stored goal whole.
GOAL_FLAGS = ("objective", "gpu_hour_price", "train_tokens", "train_samples", "deadline")
# Flags naming files or folders: stored absolute, so a continue from elsewhere finds them.
PATHS = ("base_config", "nvme_path", "trials_dir", "script")


def _default(setting: str) -> Any:
    """The default of a :class:`RunSettings` field: the settings model holds every default,
    a flag shows it (a flag that negates a setting shows its negation)."""
    return RunSettings.model_fields[setting].default


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
        default=_default("space"), description="Search space: a YAML path or a built-in name."
    )
    gpus: str = Field(
        default="1",
        description="Devices the study may use (CPU ranks without GPUs), every probe's world "
        "size; a range (1-8) or a list (2,4,8) makes the world size a searched dimension, each "
        "at the same global batch.",
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
        f"gets {format_duration(DEFAULT_BUDGET_S)}; a continued one keeps what is left of its "
        "own unless given a new total.",
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
        default=_default("storage_url"),
        description="Optuna storage URL (any SQLAlchemy URL Optuna takes).",
    )
    seed: int | None = Field(default=_default("seed"), description="Sampler seed.")
    executor: Literal["ray", "local"] = Field(
        default=_default("executor"),
        description="'ray' (Ray core tasks) or 'local' (subprocesses, no Ray).",
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
        default=not _default("warm_workers"),
        description="Start every probe as a new launch (as DeepSpeed's autotuner does) "
        "instead of keeping warm workers.",
    )
    no_prune: bool = Field(
        default=not _default("prune"), description="Probe even what the memory model rules out."
    )
    memory_margin: float = Field(
        default=_default("memory_margin"),
        ge=0.0,
        lt=1.0,
        description="Prune above the limit minus this share of it (0.05 = 5%).",
    )
    host_ram: str = Field(
        default="auto", description="Host RAM a node may use, e.g. 512GiB, or 'auto' (this one's)."
    )
    warmup_steps: int = Field(
        default=_default("warmup_steps"),
        gt=0,
        description="Untimed optimizer steps per probe, at least.",
    )
    timed_steps: int = Field(
        default=_default("timed_steps"),
        gt=0,
        description="Timed optimizer steps per probe, at least.",
    )
    max_timed_steps: int = Field(
        default=_default("max_timed_steps"),
        gt=0,
        description="Timed steps at most; a probe stops once its spread is under 2%.",
    )
    sampler: Literal["autotune", "tpe", "gp", "random", "grid"] = Field(
        default=_default("sampler"),
        description="autotune (model-guided), tpe, gp, random, or grid (every valid candidate "
        "once).",
    )
    no_confirm: bool = Field(
        default=not _default("confirm"),
        description="Skip the confirmation round (re-probing the top candidates, interleaved).",
    )
    verify: Literal["off", "on", "strict"] = Field(
        default="strict" if _default("verify_strict") else "on" if _default("verify") else "off",
        description="Before exporting, check that the best trains as its reference does "
        "(your base config, else fp32 at ZeRO-0; autotune verify), its time held back from "
        "the search: --verify alone, or --verify strict to set aside a best whose check "
        "differs and export the next best checked (up to two runners-up).",
        json_schema_extra={"optional_value": "on"},
    )
    verify_strict: bool = Field(
        default=False,
        description="The same as --verify strict.",
        json_schema_extra={"hidden": True},
    )
    objective: str = Field(
        default="throughput",
        description="What ranks configurations: throughput (samples/s), cost (the least per "
        "sample: needs --gpu-hour-price) or deadline (the cheapest that trains --train-tokens "
        "or --train-samples within --deadline, else the fastest); they differ across world "
        "sizes (--gpus 1-8).",
    )
    gpu_hour_price: float | None = Field(
        default=None, description="USD for one GPU for an hour (cost and time to train)."
    )
    train_tokens: str | None = Field(
        default=None, description="Tokens of the production training run, e.g. 10B or 2.5e12."
    )
    train_samples: str | None = Field(
        default=None, description="Samples of the production training run, e.g. 5M."
    )
    deadline: str | None = Field(
        default=None, description="Wall time the production run may take, e.g. 3d or 36h."
    )
    no_early_stop: bool = Field(
        default=not _default("early_stop"),
        description="Time every probe in full, even when clearly slower.",
    )
    shared: bool = Field(
        default=_default("shared"),
        description="Run side by side with other drivers of this study (a database they all "
        "reach, e.g. PostgreSQL): each takes its own proposals, none probes a candidate "
        "another has, and each runs for its own --budget.",
    )
    tf32: bool = Field(
        default=_default("tf32"),
        description="Let fp32 matmuls use TF32 on GPUs, as your training does if it sets "
        "torch.set_float32_matmul_precision('high') (default: IEEE fp32, PyTorch's default).",
    )
    trials_dir: str = Field(
        default=str(_default("trials_dir")), description="Folder for per-trial logs and the export."
    )
    retry_failed: bool = Field(
        default=_default("retry_failed"),
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

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus_text(cls, value: Any) -> Any:
        """A project file's ``gpus: 4`` (and a study stored when --gpus was a number)."""
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("verify", mode="before")
    @classmethod
    def _verify_switch(cls, value: Any) -> Any:
        """A project file's ``verify: true`` (and a study stored when --verify was a switch)."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @classmethod
    def resolve(cls, given: dict[str, Any], stored: dict[str, Any]) -> RunFlags:
        """Model defaults, then a continued study's stored flags, then the flags given;
        checked whole (units, relations, the study's name) before any file is opened."""
        given = {k: v for k, v in given.items() if v is not None and v is not False and v != []}
        if any(name in given for name in GOAL_FLAGS):  # a new goal replaces the stored one
            stored = {k: v for k, v in stored.items() if k not in GOAL_FLAGS}
        values = {**inherited(stored, given, flags=cls.model_fields), **given}
        try:
            flags = cls(**values)
        except ValueError as exc:
            raise SettingsError(first_problem(exc)) from None
        flags.check()
        return flags

    def world_sizes(self) -> tuple[int, ...]:
        """--gpus as world sizes: one, or the searched ones."""
        from autotune.training_goal import parse_world_sizes

        return parse_world_sizes(self.gpus)

    def check(self) -> None:
        """What a field's type cannot say: units, and flags that must agree."""
        searched = len(self.world_sizes()) > 1
        if searched and self.gpus_per_trial is not None:
            raise SettingsError(
                f"--gpus {self.gpus} with --gpus-per-trial {self.gpus_per_trial}: a searched "
                "world size is each probe's own; leave --gpus-per-trial out"
            )
        if self.budget is not None and parse_duration(self.budget) > MAX_BUDGET_S:
            raise SettingsError(
                f"--budget {self.budget}: more than {MAX_BUDGET_S // 3600} hours "
                f"({MAX_BUDGET_S // 86400} days); give a budget such as 2h or 30m"
            )
        if self.probe_timeout is not None:
            parse_duration(self.probe_timeout, flag="--probe-timeout")
        size_or_auto(self.vram, "--vram")
        size_or_auto(self.host_ram, "--host-ram")
        parse_global_batch(self.global_batch)
        self.goal()
        if self.max_timed_steps < self.timed_steps:
            raise SettingsError(
                f"--max-timed-steps {self.max_timed_steps} is below --timed-steps "
                f"{self.timed_steps}; give --max-timed-steps {self.timed_steps} or more"
            )
        if self.study is not None:
            check_study_name(self.study, flag="--study")
        if self.ray_address is not None:
            from autotune.execution import check_ray_address

            check_ray_address(self.ray_address, self.executor)
        if self.workload is not None and self.script is not None:
            raise SettingsError(
                f"--workload {self.workload} and --script {self.script}: give one of them (a "
                "workload factory or your training script)"
            )
        if self.script is None and (self.script_args or self.script_arg):
            shown = " ".join(self.script_args) or " ".join(self.script_arg)
            raise SettingsError(
                f"script arguments ({shown[:80]}) without --script; give --script train.py "
                "before `--`, or drop the arguments"
            )

    @classmethod
    def goal_of(cls, values: dict[str, Any]) -> TrainingGoal:
        """The goal of the goal flags alone (``plan --study``), checked as ``run`` checks it."""
        try:
            flags = cls(**{k: v for k, v in values.items() if v is not None})
        except ValueError as exc:
            raise SettingsError(first_problem(exc)) from None
        return flags.goal()

    def goal(self) -> TrainingGoal:
        """The training goal, or one line naming the flag missing or wrong."""
        from autotune.training_goal import TrainingGoal, parse_count

        def count(flag: str, text: str | None) -> float | None:
            return None if text is None else parse_count(text, flag=flag)

        return TrainingGoal.of(
            self.objective,
            gpu_hour_price_usd=self.gpu_hour_price,
            train_tokens=count("--train-tokens", self.train_tokens),
            train_samples=count("--train-samples", self.train_samples),
            deadline_s=None
            if self.deadline is None
            else parse_duration(self.deadline, flag="--deadline"),
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
            from autotune.script_config import parse_script

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
            gpus=max(self.world_sizes()),
            gpus_per_trial=self.gpus_per_trial,
            world_sizes=self.world_sizes() if len(self.world_sizes()) > 1 else (),
            vram_limit_bytes=size_or_auto(self.vram, "--vram"),
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
            host_ram_bytes=size_or_auto(self.host_ram, "--host-ram"),
            max_timed_steps=self.max_timed_steps,
            sampler=self.sampler,
            early_stop=not self.no_early_stop,
            confirm=not self.no_confirm,
            verify=self.verify != "off" or self.verify_strict,
            verify_strict=self.verify == "strict" or self.verify_strict,
            tf32=self.tf32,
            shared=self.shared,
            goal=self.goal(),
        )


def with_optional_values(args: list[str]) -> list[str]:
    """``args`` with each flag whose value may be left out (``json_schema_extra``'s
    ``optional_value``: ``--verify`` or ``--verify strict``) joined to its value, which the
    command-line parser needs: ``--verify strict`` is ``--verify=strict``, a bare
    ``--verify`` is ``--verify=on``. The script's arguments after ``--`` are left alone."""
    from typing import get_args

    optional = {}
    for name, field in RunFlags.model_fields.items():
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if "optional_value" in extra:
            optional["--" + name.replace("_", "-")] = (
                extra["optional_value"],
                get_args(field.annotation),
            )
    out: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            return out + args[index:]
        if arg in optional:
            value, choices = optional[arg]
            given = args[index + 1] if index + 1 < len(args) else None
            if given in choices:
                value, index = given, index + 1
            arg = f"{arg}={value}"
        out.append(arg)
        index += 1
    return out


MAX_BUDGET_S = 30 * 24 * 3600  # a month: past it, a typo (99999h), not a plan
# A study name becomes a folder under --trials-dir and text in shell scripts: keep it plain.
