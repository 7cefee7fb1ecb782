"""Reading a space file: YAML validated as a :class:`~autotune.space.SpaceSpec`, each error
one line that names the file, the line, the key and what is allowed."""

from __future__ import annotations

import yaml
from pydantic import BaseModel, ValidationError

from autotune.errors import SpaceError
from autotune.space._files import key_lines, resolve_space_path
from autotune.space._fsdp_choices import FsdpChoices
from autotune.space._zero_knob_choices import ZeroKnobChoices
from autotune.space.search_space import SpaceSpec


def load_space(ref: str) -> SpaceSpec:
    """Load and validate a space; errors name the file, the key and what is allowed."""
    name, text = resolve_space_path(ref)
    return parse_space(text, source=name)


def parse_space(text: str, *, source: str = "<space>") -> SpaceSpec:
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpaceError(f"{where}: not valid YAML ({problem}); fix the syntax") from None
    if not isinstance(data, dict):
        raise SpaceError(
            f"{source}: a space is a mapping of dimension -> list of values, got "
            f"{type(data).__name__}; see search_spaces/default.yaml"
        )
    lines = key_lines(node)
    try:
        return SpaceSpec.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [str(part) for part in error["loc"]]
        key = loc[0] if loc else "?"
        line = lines.get(".".join(loc[:2])) or lines.get(key)
        where = f"{source}:{line}" if line else source
        if error["type"] == "extra_forbidden":
            nested = {"zero_knobs": ZeroKnobChoices, "fsdp": FsdpChoices}
            model: type[BaseModel] = nested.get(key, SpaceSpec) if len(loc) > 1 else SpaceSpec
            allowed = ", ".join(model.model_fields)
            name = loc[-1]
            raise SpaceError(f"{where}: unknown key {name!r}; allowed keys: {allowed}") from None
        field = SpaceSpec.model_fields.get(key)
        hint = f" ({field.description})" if field is not None and field.description else ""
        path = key + "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in loc[1:])
        raise SpaceError(
            f"{where}: {path}: {error['msg']}, got {error.get('input')!r}{hint}"
        ) from None
