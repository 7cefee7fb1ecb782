"""Parsing of the units users type, and settings validation."""

from __future__ import annotations

import pytest

from autotune.errors import SettingsError
from autotune.settings import RunSettings, format_bytes, format_duration, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1h30m15s", 5415),
        ("1.5h", 5400),
        (" 45S ", 45),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["2x", "", "90", "h", "30m1h", "1h1h", "-5m", "0s", "1 h"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(SettingsError, match="--budget"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("80GiB", 80 * 2**30),
        ("512MiB", 512 * 2**20),
        ("16GB", 16 * 10**9),
        ("1024", 1024),
        ("1.5GiB", int(1.5 * 2**30)),
        ("2 tib", 2 * 2**40),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["80 GiBs", "lots", "-1GiB", "0GiB", "GiB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(SettingsError, match="--vram"):
        parse_size(text)


def test_formatting() -> None:
    assert format_bytes(1536 * 2**20) == "1.50 GiB"
    assert format_bytes(100) == "100 B"
    assert format_duration(5400) == "1h30m"
    assert format_duration(95) == "1m35s"
    assert format_duration(0) == "0s"


def test_settings_errors_name_the_flag() -> None:
    with pytest.raises(SettingsError, match=r"^--gpus: input should be greater than 0, got 0"):
        RunSettings.build(workload="gpt-tiny", gpus=0, budget_s=60)
    with pytest.raises(SettingsError, match=r"^--vram:"):
        RunSettings.build(workload="gpt-tiny", gpus=1, budget_s=60, vram_limit_bytes=-5)
    with pytest.raises(SettingsError, match="extra inputs"):
        RunSettings.build(workload="gpt-tiny", gpus=1, budget_s=60, colour="red")


def test_settings_are_frozen() -> None:
    settings = RunSettings.build(workload="gpt-tiny", gpus=2, budget_s=60)
    with pytest.raises(Exception, match="frozen"):
        settings.gpus = 3  # type: ignore[misc]
