"""The flags of ``autotune run``, generated from the settings they set.

Each setting declares its flag once, on its own field (:class:`autotune.flag.Flag` in
:class:`~autotune.settings.RunSettings` and its section
:class:`~autotune.training_goal.TrainingGoal`); the few flags that set no one setting
(the script and its arguments, the output's form, fault injection) are declared in
:class:`CommandFlags` the same way. :func:`flags_model` turns those declarations into
:class:`RunFlags`, one field per flag as the user types it: ``autotune run``'s options (its
``--help``), the project file's keys, what a study stores and what a continued study takes
back (:mod:`autotune.cli._stored_flags`): model defaults, then the study's stored flags,
then the flags given on this command line. :meth:`RunFlags.settings` reads each flag in its
unit (:mod:`autotune.units`) into the typed settings.
"""

from __future__ import annotations

import re
import socket
import typing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
)
from pydantic.fields import FieldInfo

from autotune.cli._flag_values import check_study_name
from autotune.cli._stored_flags import HOST_KEY, inherited
from autotune.errors import SettingsError
from autotune.flag import Flag, flag_of, problem_line
from autotune.settings import MAX_BUDGET_S, RunSettings
from autotune.units import AS_TYPED, PATH

if TYPE_CHECKING:
    from autotune.training_goal import TrainingGoal


class CommandFlags(BaseModel):
    """``autotune run``'s flags that set no one setting: the script's three (read together
    into :class:`~autotune.script_config.ScriptConfig`), the output's form, and testing
    hooks."""

    script_file: Annotated[str | None, Flag("script", PATH, names_file=True)] = Field(
        default=None,
        description="Your training script, unedited, as the probe; its arguments follow "
        "`--` (e.g. --script train.py -- --deepspeed ds_config.json).",
    )
    script_args: Annotated[list[str], Flag(positional=True)] = Field(
        default_factory=list, description="The script's arguments, after `--`."
    )
    script_arg: Annotated[list[str], Flag()] = Field(
        default_factory=list,
        description="DIMENSION=--flag: the script's own flag for micro_batch_size, "
        "gradient_accumulation_steps, activation_checkpointing, bf16 or fp16 (repeatable; "
        "the Hugging Face Trainer's flags are known).",
    )
    verify_strict: Annotated[bool, Flag(hidden=True)] = Field(
        default=False, description="The same as --verify strict."
    )
    quiet: Annotated[bool, Flag(per_run=True)] = Field(
        default=False,
        description="Plain lines, one per event, even on a terminal (no live view).",
    )
    inject_fault: Annotated[
        Literal["none", "oom", "error", "crash", "hang"], Flag(per_run=True, hidden=True)
    ] = Field(default="none", description="Testing only: make every probe fail this way.")


# Command flags shown right after --workload: a new study needs one of the two.
_AFTER_WORKLOAD = ("script", "script_args", "script_arg")


@dataclass(frozen=True)
class FlagField:
    """One flag: its name as a field (``no_prune``), where its value goes (``("prune",)``,
    ``("goal", "deadline_s")``; empty for a command flag), its declaration and the field
    that declares it."""

    name: str
    setting: tuple[str, ...]
    flag: Flag
    field: FieldInfo

    @property
    def option(self) -> str:
        return self.flag.option(self.name)

    def value(self, flag_value: Any) -> Any:
        """The setting's value of the flag's (the flag read in its unit, or negated)."""
        if self.flag.negates:
            return not flag_value
        if flag_value is None:
            return None
        return self.flag.unit.parse(flag_value, self.option)


def flag_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[FlagField]:
    """Every flag ``model`` declares, in field order: a field with a :class:`Flag`, and the
    flags of each section (a field whose model declares flags of its own)."""
    found = []
    for name, field in model.model_fields.items():
        flag = flag_of(field)
        if flag is not None:
            found.append(FlagField(flag.flag_name(name), (*prefix, name), flag, field))
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found += flag_fields(field.annotation, (*prefix, name))
    return found


def _plain(annotation: Any) -> Any:
    """A type as the command line reads it: constraints (``PositiveInt``) left to the
    field's own metadata, ``X | None`` kept."""
    if typing.get_origin(annotation) is Annotated:
        return _plain(typing.get_args(annotation)[0])
    args = typing.get_args(annotation)
    if args and type(None) in args:
        inner = [_plain(arg) for arg in args if arg is not type(None)]
        return typing.Union[(*inner, None)]
    return annotation


def _flag_definition(spec: FlagField) -> tuple[Any, Any]:
    """The flag's type and pydantic field: its default shown as the flag shows it, the
    setting's description as its help, its constraints where the flag takes the setting's
    own type."""
    flag, field = spec.flag, spec.field
    default = None if field.is_required() else field.get_default(call_default_factory=True)
    extra: dict[str, Any] = {"hidden": flag.hidden, "positional": flag.positional}
    if flag.optional_value is not None:
        extra["optional_value"] = flag.optional_value
    constraints: list[Any] = []
    if flag.negates:
        annotation: Any = bool
    elif flag.unit is AS_TYPED:
        annotation = _plain(field.annotation)
        constraints = [item for item in field.metadata if not isinstance(item, Flag)]
        if field.is_required():
            annotation = annotation | None
    else:
        annotation = flag.unit.flag_type
        if flag.shown_default is None and (default is None or field.is_required()):
            annotation = annotation | None
    if isinstance(default, list):
        definition = Field(
            default_factory=list, description=field.description, json_schema_extra=extra
        )
    else:
        definition = Field(
            default=flag.flag_default(default),
            description=field.description,
            json_schema_extra=extra,
        )
    return Annotated[(annotation, *constraints, flag)], definition


def flags_model(name: str, *models: type[BaseModel], base: type[BaseModel]) -> Any:
    """A model with one field per flag the ``models`` declare (see :func:`flag_fields`),
    named as the user types it, on ``base`` (which holds the methods)."""
    specs = [spec for model in models for spec in flag_fields(model)]
    names = [spec.name for spec in specs]
    if len(set(names)) < len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise TypeError(f"flags declared twice: {', '.join(twice)}")
    order = [spec.name for spec in specs if spec.name not in _AFTER_WORKLOAD]
    at = order.index("workload") + 1 if "workload" in order else 0
    order[at:at] = [n for n in _AFTER_WORKLOAD if n in {s.name for s in specs}]
    by_name = {spec.name: spec for spec in specs}
    fields = {flag: _flag_definition(by_name[flag]) for flag in order}
    return create_model(name, __base__=base, **fields)


class _RunFlagsBase(BaseModel):
    """What :class:`RunFlags` does with its flags; its fields are generated."""

    model_config = ConfigDict(extra="forbid")
    _parsed: dict[tuple[str, ...], Any] = PrivateAttr(default_factory=dict)

    @field_validator("gpus", mode="before", check_fields=False)
    @classmethod
    def _gpus_text(cls, value: Any) -> Any:
        """A project file's ``gpus: 4`` (and a study stored when --gpus was a number)."""
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("verify", mode="before", check_fields=False)
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
        kept = {k for k in cls.model_fields if k not in PER_RUN}
        values = {**inherited(stored, given, kept=kept, file_flags=FILE_FLAGS), **given}
        try:
            flags = cls(**values)
        except ValidationError as exc:
            raise SettingsError(problem_line(cls, exc)) from None
        flags.check()
        return flags

    def _read(self) -> dict[tuple[str, ...], Any]:
        """Every setting flag read in its unit, once (a unit's error names the flag), by its
        setting's path (``("limits", "world_sizes")``)."""
        if not self._parsed:
            self._parsed = {
                spec.setting: spec.value(getattr(self, spec.name)) for spec in FLAGS if spec.setting
            }
        return self._parsed

    def _setting(self, name: str) -> Any:
        """The value a flag gives setting ``name`` (a name is unique across sections)."""
        return next(value for path, value in self._read().items() if path[-1] == name)

    def world_sizes(self) -> tuple[int, ...]:
        """--gpus as world sizes: one, or the searched ones."""
        return self._setting("world_sizes")

    def check(self) -> None:
        """What a field's type cannot say: units, and flags that must agree."""
        searched = len(self.world_sizes()) > 1
        if searched and self._setting("gpus_per_trial") is not None:
            raise SettingsError(
                f"--gpus {self.gpus} with --gpus-per-trial {self._setting('gpus_per_trial')}: a "
                "searched world size is each probe's own; leave --gpus-per-trial out"
            )
        if (self._setting("budget_s") or 0) > MAX_BUDGET_S:
            raise SettingsError(
                f"--budget {self.budget}: more than {MAX_BUDGET_S // 3600} hours "
                f"({MAX_BUDGET_S // 86400} days); give a budget such as 2h or 30m"
            )
        self.goal()
        if self._setting("max_timed_steps") < self._setting("timed_steps"):
            raise SettingsError(
                f"--max-timed-steps {self.max_timed_steps} is below --timed-steps "
                f"{self.timed_steps}; give --max-timed-steps {self.timed_steps} or more"
            )
        if self.study is not None:
            check_study_name(self.study, flag="--study")
        if self.ray_address is not None:
            from autotune.execution import check_ray_address

            check_ray_address(self.ray_address, self.executor)
        self._check_source()

    def _check_source(self) -> None:
        """A workload or a script, and a script's arguments only with a script."""
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
        except ValidationError as exc:
            raise SettingsError(problem_line(cls, exc)) from None
        return flags.goal()

    def goal(self) -> TrainingGoal:
        """The training goal, or one line naming the flag missing or wrong."""
        from autotune.training_goal import TrainingGoal

        parsed = self._read()
        values = {path[1]: value for path, value in parsed.items() if path[0] == "goal"}
        return TrainingGoal.of(str(values.pop("objective")), **values)

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
        """The typed settings: each flag read in its unit, 'auto' resolved later."""
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
        values = {path[-1]: value for path, value in self._read().items() if path[0] != "goal"}
        values |= {
            "workload": workload,
            "script": script,
            "study_name": self.study_name(),
            "goal": self.goal(),
        }
        if self.verify_strict:
            values["verify"] = "strict"
        return RunSettings.build(**values)


FLAGS = [
    *flag_fields(RunSettings),
    *(replace(spec, setting=()) for spec in flag_fields(CommandFlags)),
]
RunFlags = flags_model("RunFlags", RunSettings, CommandFlags, base=_RunFlagsBase)
RunFlags.__doc__ = """``autotune run``'s options (a field ``gpus_per_trial`` is the flag
``--gpus-per-trial``), generated from the settings' declarations (:func:`flags_model`)."""
# Flags that concern one run, not what a study measures: never stored with the study.
PER_RUN = tuple(spec.name for spec in FLAGS if spec.flag.per_run)
# Stored flags that name files or code: taken back only on the host that stored them.
FILE_FLAGS = tuple(spec.name for spec in FLAGS if spec.flag.names_file)
# Flags naming files or folders: stored absolute, so a continue from elsewhere finds them.
PATHS = tuple(spec.name for spec in FLAGS if spec.flag.unit is PATH)
# Flags of the training goal: given together, they replace a continued study's stored goal.
GOAL_FLAGS = tuple(spec.name for spec in FLAGS if spec.setting[:1] == ("goal",))


def with_optional_values(args: list[str]) -> list[str]:
    """``args`` with each flag whose value may be left out (its :class:`Flag`'s
    ``optional_value``: ``--verify`` or ``--verify strict``) joined to its value, which the
    command-line parser needs: ``--verify strict`` is ``--verify=strict``, a bare
    ``--verify`` is ``--verify=on``. The script's arguments after ``--`` are left alone."""
    optional = {
        spec.option: (spec.flag.optional_value, typing.get_args(_plain(spec.field.annotation)))
        for spec in FLAGS
        if spec.flag.optional_value is not None
    }
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
