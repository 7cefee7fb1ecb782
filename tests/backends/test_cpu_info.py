"""py-cpuinfo asked once per boot: the real py-cpuinfo, its answer kept in a file that later
processes read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = """
import json, cpuinfo
from autotune.backends.deepspeed._cpu_info import remember_cpu_info
def never(*args, **kwargs):
    raise AssertionError("py-cpuinfo asked again")
cpuinfo.get_cpu_info_json = never
remember_cpu_info()
print(json.dumps(cpuinfo.get_cpu_info()))
"""


def test_the_first_answer_of_a_boot_serves_every_later_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpuinfo = pytest.importorskip("cpuinfo")
    from autotune.backends.deepspeed import _cpu_info as cpu_info

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpuinfo, "get_cpu_info", cpuinfo.get_cpu_info)  # restored after
    cpu_info.remember_cpu_info()
    cpu_info.remember_cpu_info()  # a second call wraps nothing twice
    first = cpuinfo.get_cpu_info()
    assert first["arch"] and first["flags"]
    first["flags"].clear()  # a caller changing its copy changes nothing kept
    assert cpuinfo.get_cpu_info()["flags"]
    files = list((tmp_path / "autotune" / "cpuinfo").glob("*.json"))
    assert len(files) == 1 and Path(cpu_info.BOOT_ID).read_text().strip() in files[0].name
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
        check=False,
    )
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == cpuinfo.get_cpu_info()


def test_a_damaged_answer_file_is_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpuinfo = pytest.importorskip("cpuinfo")
    from autotune.backends.deepspeed import _cpu_info as cpu_info

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = Path(cpu_info._answer_file() or pytest.skip("no boot id on this system"))
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    monkeypatch.setattr(cpuinfo, "get_cpu_info", cpuinfo.get_cpu_info)
    cpu_info.remember_cpu_info()
    assert cpuinfo.get_cpu_info()["arch"]
    assert json.loads(path.read_text())["arch"]
