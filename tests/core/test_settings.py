"""Parsing of the units users type, and settings validation."""

from __future__ import annotations

import functools

import pytest

from autotune.errors import SettingsError
from autotune.settings import RunSettings
from autotune.units import format_bytes, format_duration, parse_duration, parse_size


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
        RunSettings.build(workload="gpt-tiny", world_sizes=(0,), budget_s=60)
    with pytest.raises(SettingsError, match=r"^--vram:"):
        RunSettings.build(workload="gpt-tiny", world_sizes=(1,), budget_s=60, vram_limit_bytes=-5)
    with pytest.raises(SettingsError, match="extra inputs"):
        RunSettings.build(workload="gpt-tiny", world_sizes=(1,), budget_s=60, colour="red")


def test_settings_are_frozen() -> None:
    settings = RunSettings.build(workload="gpt-tiny", world_sizes=(2,), budget_s=60)
    with pytest.raises(Exception, match="frozen"):
        settings.limits.world_sizes = (3,)  # type: ignore[misc]


def test_a_continue_takes_stored_files_only_from_this_host_and_user(tmp_path) -> None:
    """A shared database must not choose which code a continue imports or where files go:
    a stored file or code reference is taken back only on the host that stored it, and only
    when the file is this user's."""
    import os
    import socket

    from autotune.cli._flags import FILE_FLAGS, PER_RUN, RunFlags
    from autotune.cli._stored_flags import HOST_KEY, inherited
    from autotune.errors import SettingsError

    kept = set(RunFlags.model_fields) - set(PER_RUN)
    workload = tmp_path / "mine.py"
    workload.write_text("def make(): ...\n")
    here = socket.gethostname()
    stored = RunFlags(workload=f"{workload}:make", gpus=2).stored()
    assert stored[HOST_KEY] == here
    assert (
        inherited(stored, {}, kept=kept, file_flags=FILE_FLAGS)["workload"] == f"{workload}:make"
    )  # same host, own file
    # another host: refused, naming the flag and how to continue
    with pytest.raises(SettingsError, match=r"started on elsewhere.*--workload PATH"):
        inherited({**stored, HOST_KEY: "elsewhere"}, {}, kept=kept, file_flags=FILE_FLAGS)
    # given explicitly, it is the user's choice
    assert (
        inherited(
            {**stored, HOST_KEY: "elsewhere"},
            {"workload": "gpt-tiny"},
            kept=kept,
            file_flags=FILE_FLAGS,
        )["gpus"]
        == "2"
    )
    # a built-in workload is no file: taken back from anywhere; the trials folder falls back
    # to this host's default
    builtin = {**RunFlags(workload="gpt-tiny").stored(), HOST_KEY: "elsewhere"}
    assert inherited(builtin, {}, kept=kept, file_flags=FILE_FLAGS) == {
        k: v for k, v in builtin.items() if k not in (HOST_KEY, "trials_dir")
    }
    # another user's file on this host: refused
    if os.getuid() == 0:
        os.chown(workload, 65534, 65534)
        with pytest.raises(SettingsError, match="--workload"):
            inherited(stored, {}, kept=kept, file_flags=FILE_FLAGS)


def test_every_flag_left_out_resolves_to_the_settings_default():
    """The settings model holds the defaults: a run given only its workload gets, for every
    setting a flag sets, that setting's default (a negating flag such as --no-prune its
    negation), so the command line and the library cannot drift apart."""
    from autotune.cli._flags import RunFlags, flag_fields
    from autotune.settings import RunSettings

    resolved = RunFlags(workload="gpt-tiny").settings()
    # set from the flags but not defaults of their own: the workload, its study name, the
    # required device count, and 'auto' sizes resolved later
    own = {"workload", "study_name"}
    checked = 0
    for spec in flag_fields(RunSettings):
        if spec.setting[-1] in own or spec.field.is_required():
            continue
        value = functools.reduce(getattr, spec.setting, resolved)
        assert value == spec.field.get_default(call_default_factory=True), spec.setting
        checked += 1
    assert checked == len(flag_fields(RunSettings)) - len(own)


AFTER = ["--", "--verify", "strict"]  # the script's own arguments after `--` are its own


@pytest.mark.parametrize(
    ("argv", "joined"),
    [
        (["run", "--verify"], ["run", "--verify=on"]),
        (["--verify", "strict", "--budget", "1h"], ["--verify=strict", "--budget", "1h"]),
        (["--verify", "--budget", "1h"], ["--verify=on", "--budget", "1h"]),
        (["run", "--verify", "off"], ["run", "--verify=off"]),
        (["run", "--script", "t.py", *AFTER], ["run", "--script", "t.py", *AFTER]),
    ],
)
def test_verify_takes_an_optional_value(argv: list[str], joined: list[str]) -> None:
    from autotune.cli._flags import with_optional_values

    assert with_optional_values(argv) == joined


def test_verify_strict_sets_both_settings_and_a_stored_switch_still_reads() -> None:
    """``--verify strict`` is the strict check; a study stored when ``--verify`` was a
    switch (``verify: true``, ``verify_strict: true``) continues as it was started."""
    from autotune.cli._flags import RunFlags

    def settings(**flags: object) -> tuple[bool, bool]:
        resolved = RunFlags.resolve({"workload": "gpt-tiny"}, flags).settings()
        return resolved.search.checks_loss, resolved.search.verify_strict

    assert settings() == (False, False)
    assert settings(verify="on") == (True, False)
    assert settings(verify="strict") == (True, True)
    assert settings(verify=True) == (True, False)
    assert settings(verify=True, verify_strict=True) == (True, True)
    assert settings(verify=False) == (False, False)
