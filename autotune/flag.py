"""A setting's command-line flag, declared once on the setting's own field.

A field of :class:`~autotune.settings.RunSettings` (or of a section of it, such as
:class:`~autotune.training_goal.TrainingGoal`) carries a :class:`Flag` in its ``Annotated``
metadata: the flag's name where it differs from the field's (``--vram`` for
``vram_limit_bytes``), the unit its text is read in, whether it negates the setting
(``--no-prune``), and how a study keeps it. ``autotune run``'s options, their help and
defaults, the project file's keys, a study's stored flags and the flag an error line names
are all derived from these fields (:mod:`autotune.cli._flags`); the field's description is
the flag's help.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.units import AS_TYPED, Unit

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError
    from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class Flag:
    """How one setting is typed on ``autotune run``'s command line."""

    name: str | None = None  # the flag's name as a field (vram for --vram); None: the setting's
    unit: Unit = AS_TYPED  # how the flag's text becomes the setting's value
    negates: bool = False  # the flag switches the setting off (--no-prune for prune)
    per_run: bool = False  # concerns one run, not what a study measures: a study does not keep it
    names_file: bool = False  # names a file, folder or code: stored absolute, host-bound
    shown_default: str | None = None  # the flag's default where the setting's None means it
    hidden: bool = False  # testing only or an alias: left out of --help
    optional_value: str | None = None  # the value of the flag given bare (--verify is "on")
    positional: bool = False  # the command's arguments (what follows `--`), not an option

    def flag_name(self, field_name: str) -> str:
        """The flag as a field name (``no_prune``)."""
        return self.name or field_name

    def option(self, field_name: str) -> str:
        """The flag as typed (``--no-prune``)."""
        return "--" + self.flag_name(field_name).replace("_", "-")

    def flag_default(self, setting_default: Any) -> Any:
        """The flag's default, from the setting's: the flag shows what the setting holds."""
        if self.shown_default is not None:
            return self.shown_default
        if self.negates:
            return not setting_default
        if self.unit is AS_TYPED or setting_default is None:
            return setting_default
        return str(setting_default)


def flag_of(field: FieldInfo) -> Flag | None:
    """The :class:`Flag` a settings field declares, if it has one."""
    return next((item for item in field.metadata if isinstance(item, Flag)), None)


def setting_field(model: type[BaseModel], name: str) -> FieldInfo | None:
    """The field that declares setting ``name`` in ``model`` or in one of its sections (a
    field whose type is a model of its own); None if none does."""
    from pydantic import BaseModel

    if name in model.model_fields:
        return model.model_fields[name]
    for field in model.model_fields.values():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            found = setting_field(section, name)
            if found is not None:
                return found
    return None


def problem_line(model: type[BaseModel], exc: ValidationError) -> str:
    """pydantic's first complaint about ``model``'s values as one line naming the flag of
    the setting it is about (inside a section: the section's field), else the field's name
    as a flag."""
    error = exc.errors()[0]
    names = [str(part) for part in error["loc"] if isinstance(part, str)]
    field_name = names[-1] if names else "settings"
    info = None
    for name in names:  # the deepest named field of the location that declares a setting
        found = setting_field(model, name)
        if found is not None:
            info, field_name = found, name
    if names and field_name != names[-1]:  # an input no field takes (an extra one)
        info, field_name = None, names[-1]
    flag = flag_of(info) if info is not None else None
    option = flag.option(field_name) if flag is not None else "--" + field_name.replace("_", "-")
    return f"{option}: {error['msg'].lower()}, got {error.get('input')!r}"
