"""CI: the built wheel holds every git-tracked file under ``autotune/`` and
``search_spaces/``, each at its installed path (``search_spaces/X`` is
``autotune/search_spaces/X``). Exits 1 naming each file the wheel lacks.

    python .ci/wheel_files.py dist/autotune-0.1.0-py3-none-any.whl
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
SHIPPED = ("autotune", "search_spaces")


def installed_path(tracked: str) -> str:
    """Where a tracked file lies in the wheel: search_spaces/ is the package
    autotune.search_spaces (pyproject.toml's package-dir)."""
    return f"autotune/{tracked}" if tracked.startswith("search_spaces/") else tracked


def missing_files(wheel: Path, checkout: Path = CHECKOUT) -> list[str]:
    """The tracked files of ``SHIPPED`` that ``wheel`` does not hold, as tracked paths."""
    listed = subprocess.run(
        ["git", "-C", str(checkout), "ls-files", "-z", "--", *SHIPPED],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    tracked = [path for path in listed.split("\0") if path]
    with zipfile.ZipFile(wheel) as archive:
        held = set(archive.namelist())
    return sorted(path for path in tracked if installed_path(path) not in held)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: python .ci/wheel_files.py WHEEL (a built autotune wheel)", file=sys.stderr)
        return 2
    wheel = Path(argv[0])
    missing = missing_files(wheel)
    if missing:
        print(
            f"{wheel.name} lacks {len(missing)} tracked file(s): {', '.join(missing)}; "
            "a package or data file is left out of the build (setup.py, pyproject.toml's "
            "[tool.setuptools])",
            file=sys.stderr,
        )
        return 1
    print(f"{wheel.name}: holds every tracked file of {' and '.join(SHIPPED)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
