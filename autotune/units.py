"""The units users type and read, each parsed and formatted here: durations (``2h``), sizes
(``80GiB``), counts (``10B``), world sizes (``1-8``), the global batch (``auto``).

A parser raises :class:`SettingsError` with one line that names the flag, says what was
wrong and how to write it. :class:`Unit` is how a setting's flag is read: the type the
command line takes and the parser from it to the setting's value
(:class:`autotune.flag.Flag` names a field's unit).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import SettingsError

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_DURATION_FULL = re.compile(r"^(?:\d+(?:\.\d+)?[dhms])+$")
_SECONDS_PER_UNIT = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}

# Binary (IEC) and decimal (SI) units; a bare number is bytes.
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([a-zA-Z]*)$")
_COUNT_SCALE = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_duration(text: str, *, flag: str = "--budget") -> float:
    """``"90s"``, ``"30m"``, ``"2h"``, ``"1h30m"``, ``"3d"`` -> seconds (units in d, h, m,
    s order)."""
    value = text.strip().lower()
    if not _DURATION_FULL.match(value):
        raise SettingsError(
            f"{flag}: cannot read duration {text!r}; use a number with a unit d, h, m or s, "
            "e.g. 90s, 30m, 2h, 1h30m or 3d"
        )
    parts = _DURATION_PART.findall(value)
    units = [unit for _, unit in parts]
    if units != sorted(set(units), key="dhms".index):
        raise SettingsError(
            f"{flag}: duration {text!r} repeats or misorders its units; write days, hours, "
            "minutes, then seconds, e.g. 1h30m"
        )
    seconds = sum(float(number) * _SECONDS_PER_UNIT[unit] for number, unit in parts)
    if seconds <= 0:
        raise SettingsError(f"{flag}: duration {text!r} is zero; give a positive duration")
    return seconds


def format_duration(seconds: float) -> str:
    """``5400`` -> ``1h30m``; ``95`` -> ``1m35s``."""
    whole_s = round(seconds)
    hours, rest = divmod(whole_s, 3600)
    minutes, secs = divmod(rest, 60)
    text = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return text + (f"{secs}s" if secs or not text else "")


def parse_size(text: str, *, flag: str = "--vram") -> int:
    """``"80GiB"``, ``"512MiB"``, ``"16GB"``, ``"1073741824"`` -> bytes."""
    match = _SIZE.match(text.strip())
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise SettingsError(
            f"{flag}: cannot read size {text!r}; use a number with a unit such as 80GiB, "
            "512MiB or 16GB (GiB = 2^30 bytes, GB = 10^9 bytes)"
        )
    size_bytes = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if size_bytes <= 0:
        raise SettingsError(f"{flag}: size {text!r} is zero; give a positive size")
    return size_bytes


def size_or_auto(text: str, flag: str) -> int | None:
    """A size, or None for ``auto`` (what the hardware offers, resolved later)."""
    return None if text == "auto" else parse_size(text, flag=flag)


def format_bytes(size_bytes: float) -> str:
    """Human-readable binary size, e.g. ``1.50 GiB``."""
    value = float(size_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def parse_count(text: str, *, flag: str) -> float:
    """``"10e9"``, ``"10B"``, ``"500M"``, ``"2.5k"`` -> a positive count."""
    value = text.strip().upper().replace("_", "")
    scale = _COUNT_SCALE.get(value[-1:], 1.0)
    number = value[:-1] if scale != 1.0 else value
    try:
        count = float(number) * scale
    except ValueError:
        raise SettingsError(
            f"{flag}: cannot read {text!r}; give a count such as 10e9, 10B, 500M or 2.5k"
        ) from None
    if not count > 0:
        raise SettingsError(f"{flag} {text}: give a positive count")
    return count


def parse_world_sizes(text: str, *, flag: str = "--gpus") -> tuple[int, ...]:
    """``"8"`` -> (8,); ``"1-4"`` -> (1, 2, 3, 4); ``"2,4,8"`` -> (2, 4, 8); sorted."""
    sizes: set[int] = set()
    for part in text.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise SettingsError(
                f"{flag} {text}: give a number of GPUs (8), a range (1-8) or a list (2,4,8)"
            ) from None
        if first < 1 or last < first:
            raise SettingsError(
                f"{flag} {text}: {part} is not a positive count or an increasing range"
            )
        sizes.update(range(first, last + 1))
    return tuple(sorted(sizes))


def parse_global_batch(text: str, *, flag: str = "--global-batch") -> int | str:
    """``"32"`` -> 32; ``"auto"`` stays (the global batch is then searched)."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise SettingsError(f"{flag} {text}: give a positive integer or 'auto'")
    return value


@dataclass(frozen=True)
class Unit:
    """How a flag's text becomes a setting's value: ``parse(text, flag)``, where ``flag``
    (``--budget``) names it in an error line; ``flag_type`` is what the command line takes."""

    name: str
    parse: Callable[[Any, str], Any]
    flag_type: type = str


def _as_is(value: Any, flag: str) -> Any:
    return value


AS_TYPED = Unit("as typed", _as_is, flag_type=object)  # the flag's value is the setting's
TEXT = Unit("text", _as_is)  # text the setting's own model checks (an enum's value)
DURATION = Unit("duration", lambda text, flag: parse_duration(text, flag=flag))
SIZE_OR_AUTO = Unit("size or auto", lambda text, flag: size_or_auto(text, flag))
COUNT = Unit("count", lambda text, flag: parse_count(text, flag=flag))
GLOBAL_BATCH = Unit("global batch", lambda text, flag: parse_global_batch(text, flag=flag))
WORLD_SIZES = Unit("world sizes", lambda text, flag: parse_world_sizes(text, flag=flag))
PATH = Unit("path", lambda text, flag: Path(text))
