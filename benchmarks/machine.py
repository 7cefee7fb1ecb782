"""What a benchmark's data file records of where it ran: the checkout's commit, the date, the
CPU (its model and the vector extensions that set its matmul rates)."""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

from autotune.hardware import cpu_name

# AVX2 emulates bf16 (far slower than fp32); AVX-512 BF16 and AMX run it natively
VECTOR_FLAGS = {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}


def commit() -> str | None:
    """The short commit of the checkout this file lies in (None outside a checkout)."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
        check=False,
    )
    return done.stdout.strip() or None


def today() -> str:
    return datetime.date.today().isoformat()


def cpu_flags() -> list[str]:
    """Which of :data:`VECTOR_FLAGS` this CPU has (Linux's /proc/cpuinfo; [] elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted(set(line.split(":", 1)[1].split()) & VECTOR_FLAGS)
    except OSError:
        pass
    return []


__all__ = ["commit", "cpu_flags", "cpu_name", "today"]
