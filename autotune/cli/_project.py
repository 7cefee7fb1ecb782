"""The project file: ``autotune run`` flags kept beside the training code.

In a folder with an ``autotune.yaml`` (or a ``[tool.autotune]`` table in its
``pyproject.toml``), ``autotune run --budget 2h --gpus 4`` is the whole command: the file
names the script and its arguments (or a workload), the base config, the space, the global
batch. Its keys are ``autotune run``'s flags (``global_batch`` or ``global-batch``), checked
by the same model (:class:`~autotune.cli._flags.RunFlags`): an unknown key or a bad value is one
line naming the file.

Layers, lowest first: the flags' defaults, a continued study's stored flags, the project
file, the flags given on the command line. The file counts as flags the user typed: a file
edited to change what a study measured is refused like such a flag, never silently ignored.
``autotune init SCRIPT -- ARGS`` writes a commented file from a script and its arguments.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from autotune.errors import SettingsError
from autotune.settings import DEFAULT_BUDGET_S
from autotune.units import format_duration

PROJECT_FILE = "autotune.yaml"
PYPROJECT = "pyproject.toml"
# Flags a project file may not set: testing hooks.
NOT_IN_FILE = ("inject_fault",)
# A flag given on the command line replaces these keys of the file as a group.
GROUPS = {
    "workload": ("script", "script_args", "script_arg"),
    "script": ("workload", "script_args", "script_arg"),
}


def find(folder: Path) -> tuple[dict[str, Any], str] | None:
    """The raw table of the folder's project file and how to name it, or None."""
    path = folder / PROJECT_FILE
    if path.is_file():
        import yaml

        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SettingsError(f"{PROJECT_FILE}: not valid YAML ({first})") from None
        if data is None:
            return {}, PROJECT_FILE
        if not isinstance(data, dict):
            raise SettingsError(
                f"{PROJECT_FILE}: must map flags to values (e.g. `script: train.py`), got "
                f"{type(data).__name__}"
            )
        return data, PROJECT_FILE
    path = folder / PYPROJECT
    if not path.is_file():
        return None
    table = _toml(path).get("tool", {}).get("autotune")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise SettingsError(f"{PYPROJECT}: [tool.autotune] must be a table of flags")
    return table, f"{PYPROJECT} [tool.autotune]"


def _toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise SettingsError(
                f"{PYPROJECT}: reading it needs Python 3.11 or `pip install tomli`; or put the "
                f"flags in {PROJECT_FILE}"
            ) from None
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{PYPROJECT}: not valid TOML ({exc})") from None


def project_flags(folder: Path) -> tuple[dict[str, Any], str | None]:
    """The flags the folder's project file gives (checked), and the file's name."""
    from autotune.cli._flags import RunFlags

    found = find(folder)
    if found is None:
        return {}, None
    raw, name = found
    allowed = [f for f in RunFlags.model_fields if f not in NOT_IN_FILE]
    values: dict[str, Any] = {}
    for key, value in raw.items():
        field = str(key).replace("-", "_")
        if field not in allowed:
            raise SettingsError(
                f"{name}: unknown key {key!r}; allowed keys are autotune run's flags: "
                f"{', '.join(allowed)}"
            )
        values[field] = _typed(field, value)
    try:
        RunFlags.resolve(values, {})
    except SettingsError as exc:
        raise SettingsError(f"{name}: {exc}") from None
    return values, name


def _typed(field: str, value: Any) -> Any:
    """A YAML/TOML value as the flag's type: numbers for text flags become text (``budget:
    90`` is not a duration), a string of script arguments is split like a shell does."""
    from autotune.cli._flags import RunFlags

    annotation = RunFlags.model_fields[field].annotation
    if annotation in (list[str],):
        if isinstance(value, str):
            return shlex.split(value)
        if isinstance(value, list):
            return [str(v) for v in value]
    if (
        annotation in (str, str | None)
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
    ):
        return str(value)
    return value


def layer(given: dict[str, Any], folder: Path) -> tuple[dict[str, Any], str | None]:
    """The flags given on the command line over the project file's."""
    project, name = project_flags(folder)
    typed = {k: v for k, v in given.items() if v is not None and v is not False and v != []}
    for flag, replaced in GROUPS.items():
        if flag in typed:
            for key in replaced:
                if key not in typed:
                    project.pop(key, None)
    return {**project, **typed}, name


def render(
    script: str, args: list[str], *, gpus: int, folder: Path, budget: str | None = None
) -> str:
    """A commented project file for ``script`` and its arguments."""
    from autotune.script_config import flag_value, parse_script

    parsed = parse_script(script, args, [], cwd=folder)
    lines = [
        "# autotune project file: `autotune run` in this folder reads it, and flags given on the",
        "# command line win over it. Its keys are autotune run's flags (autotune run --help).",
        "",
        "# The training script autotune probes, unedited, and its arguments.",
        f"script: {json.dumps(script)}",
        f"script_args: {json.dumps(args)}",
    ]
    if parsed.kind == "hf":
        lines += [
            "# A Hugging Face Trainer script: per candidate autotune sets its",
            "# --per_device_train_batch_size, --gradient_accumulation_steps,",
            "# --gradient_checkpointing and --bf16/--fp16.",
        ]
    else:
        lines += [
            "# The script reads its micro-batch from the config (engine.train_micro_batch_size_",
            "# per_gpu()); if it has flags of its own, name them, e.g.:",
        ]
    lines.append("# script_arg: [micro_batch_size=--batch-size, activation_checkpointing=--ckpt]")
    lines += ["", "# Your DeepSpeed config: its optimizer, scheduler, clipping ... are kept."]
    config = parsed.config_path
    lines.append(
        f"# (from {parsed.config_flag} {flag_value(args, parsed.config_flag or '')})"
        if config
        else "base_config: ds_config.json  # the config your script builds, as a file"
    )
    lines += ["", "# Samples per optimizer step over all ranks."]
    batch = _current_batch(parsed, args, gpus)
    lines.append(f"global_batch: {batch}" if batch else "# global_batch: 32")
    lines += [
        "",
        "# Devices the study may use (CPU ranks on a machine without GPUs).",
        f"gpus: {gpus}",
        "# Search space: default, or a YAML file (autotune space --help).",
        "space: default",
        "# The study's total wall-clock budget (a continued study runs on what is left).",
        f"budget: {budget or format_duration(DEFAULT_BUDGET_S)}",
        "",
    ]
    return "\n".join(lines)


def _current_batch(parsed: Any, args: list[str], gpus: int) -> int | None:
    """The global batch the script trains with now, if its arguments or config say."""
    from autotune.script_config import flag_value

    config: dict[str, Any] = {}
    if parsed.config_path:
        try:
            config = json.loads(Path(parsed.config_path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = {}
    if isinstance(config.get("train_batch_size"), int):
        return int(config["train_batch_size"])

    def number(dimension: str, key: str) -> int | None:
        text = flag_value(args, parsed.flags.get(dimension, "")) or config.get(key)
        return int(text) if str(text).isdigit() else None

    micro = number("micro_batch_size", "train_micro_batch_size_per_gpu")
    accumulation = number("gradient_accumulation_steps", "gradient_accumulation_steps") or 1
    return micro * accumulation * gpus if micro else None


def init(script: str, args: list[str], *, gpus: int, folder: Path) -> Path:
    """Write ``autotune.yaml`` for ``script`` in ``folder``; never over an existing one."""
    path = folder / PROJECT_FILE
    if path.exists():
        raise SettingsError(
            f"{PROJECT_FILE} exists in {folder}; edit it, or remove it to write a new one"
        )
    found = find(folder)
    if found is not None:
        raise SettingsError(f"{found[1]} already holds autotune's flags; edit it there")
    text = render(script, args, gpus=gpus, folder=folder)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"cannot write {path}: {exc.strerror}") from None
    return path
