"""One flag value each, parsed or checked: a study's name."""

from __future__ import annotations

import re

from autotune.errors import SettingsError

STUDY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def check_study_name(name: str, *, flag: str) -> str:
    if not STUDY_NAME.match(name):
        raise SettingsError(
            f"{flag}: study name {name!r} must be 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (it names a folder under --trials-dir)"
        )
    return name
