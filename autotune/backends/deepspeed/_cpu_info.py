"""py-cpuinfo's answer about this machine's CPU, asked once per boot instead of once per op.

DeepSpeed's op builders ask py-cpuinfo for the CPU's architecture and SIMD flags every time
a JIT op is loaded (``OpBuilder.cpu_arch`` and ``OpBuilder.simd_width``: two calls an op,
cached ops included), and py-cpuinfo answers each call from a fresh Python subprocess that
runs itself (``cpuinfo.get_cpu_info_json``): a second-scale cost of CPU a call, four to six
calls in every probe rank and in the driver (benchmarks/RESULTS.md, "Start and end of a run
and of a probe launch"). The answer does not change while the machine runs, so
the first call of a boot keeps it in a file named by the kernel's boot id (one per node,
also where nodes share a home folder) and every later call, in any process, reads that.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from typing import Any

from autotune.cache_dir import cache_root

BOOT_ID = "/proc/sys/kernel/random/boot_id"  # Linux: new at every boot


def _answer_file() -> str | None:
    """Where this boot's answer is kept, or None where the boot has no id (not Linux)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        with open(BOOT_ID, encoding="ascii") as handle:
            boot = handle.read().strip()
        release = version("py-cpuinfo")
    except (OSError, PackageNotFoundError):
        return None
    return os.path.join(cache_root(), "cpuinfo", f"{boot}-{release}.json")


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as handle:
            answer = json.load(handle)
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def _write(path: str, answer: dict[str, Any]) -> None:
    """Written whole (a temporary file moved into place): a reader never sees half of it."""
    with contextlib.suppress(OSError, TypeError, ValueError):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(answer, handle)
        os.replace(temporary, path)


def remember_cpu_info() -> None:
    """Make ``cpuinfo.get_cpu_info`` in this process answer from this boot's file, asking
    py-cpuinfo itself only when no process asked before. Without py-cpuinfo, nothing to do
    (DeepSpeed then reads ``lscpu``)."""
    try:
        import cpuinfo
    except ImportError:
        return
    asked = cpuinfo.get_cpu_info
    if getattr(asked, "_autotune_remembered", False):
        return
    path = _answer_file()
    kept: list[dict[str, Any]] = []

    def get_cpu_info() -> dict[str, Any]:
        if not kept:
            answer = _read(path) if path else None
            if answer is None:
                answer = asked()
                if path:
                    _write(path, answer)
            kept.append(answer)
        return copy.deepcopy(kept[0])  # callers may change what they get

    get_cpu_info._autotune_remembered = True  # type: ignore[attr-defined]
    cpuinfo.get_cpu_info = get_cpu_info
