"""Where search spaces come from: the built-in YAML files shipped in the package, a path
given on the command line, and the line of each key (for error messages that name it)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from autotune.errors import SpaceError

SPACES_PACKAGE = "autotune.search_spaces"


def builtin_space_names() -> list[str]:
    root = resources.files(SPACES_PACKAGE)
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def resolve_space_path(ref: str) -> tuple[str, str]:
    """A path or a built-in name -> (display name, YAML text)."""
    path = Path(ref)
    if path.is_file():
        try:
            return str(path), path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise SpaceError(
                f"{path}: not UTF-8 text (byte {exc.start}); save the space file as UTF-8"
            ) from None
        except OSError as exc:
            raise SpaceError(f"--space {path}: cannot read it ({exc.strerror})") from None
    root = resources.files(SPACES_PACKAGE)
    builtin = root / f"{ref}.yaml"
    if "/" not in ref and not ref.endswith((".yaml", ".yml")) and builtin.is_file():
        return f"search_spaces/{ref}.yaml", builtin.read_text(encoding="utf-8")
    raise SpaceError(
        f"--space {ref}: no such file, and no built-in space of that name; give a YAML path "
        f"or one of: {', '.join(builtin_space_names())}"
    )


def key_lines(node: yaml.Node | None, prefix: str = "") -> dict[str, int]:
    """Line number (1-based) of each key (and of nested mapping keys), for error messages."""
    if not isinstance(node, yaml.MappingNode):
        return {}
    lines: dict[str, int] = {}
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode):
            name = f"{prefix}{key.value}"
            lines[name] = key.start_mark.line + 1
            lines.update(key_lines(value, prefix=f"{name}."))
    return lines
