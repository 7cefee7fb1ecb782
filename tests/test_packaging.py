"""CI's check of the built wheel (.ci/wheel_files.py): a wheel must hold every tracked file
of autotune/ and search_spaces/ at its installed path, and a wheel that lacks one fails
naming it. (CI builds the real wheel and checks it with this script before the tests.)"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.paths import ROOT

CHECK = ROOT / ".ci" / "wheel_files.py"
LEFT_OUT = ("autotune/backends/fsdp2/_engine.py", "search_spaces/default.yaml")


def _wheel(path: Path, leave_out: tuple[str, ...]) -> Path:
    """A wheel-shaped zip of the checkout's tracked files at their installed paths."""
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--", "autotune", "search_spaces"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    with zipfile.ZipFile(path, "w") as archive:
        for name in filter(None, tracked):
            if name not in leave_out:
                installed = f"autotune/{name}" if name.startswith("search_spaces/") else name
                archive.writestr(installed, "")
        archive.writestr("autotune-0.1.0.dist-info/RECORD", "")
    return path


def _check(wheel: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), str(wheel)], capture_output=True, text=True, timeout=60
    )


def test_a_wheel_with_every_tracked_file_passes(tmp_path: Path) -> None:
    result = _check(_wheel(tmp_path / "autotune-0.1.0-py3-none-any.whl", ()))
    assert result.returncode == 0, result.stderr
    assert "holds every tracked file" in result.stdout


def test_a_wheel_without_a_tracked_file_fails_naming_it(tmp_path: Path) -> None:
    result = _check(_wheel(tmp_path / "autotune-0.1.0-py3-none-any.whl", LEFT_OUT))
    assert result.returncode == 1, result.stdout
    assert result.stderr.count("\n") == 1, result.stderr
    assert "lacks 2 tracked file(s): " + ", ".join(LEFT_OUT) in result.stderr
