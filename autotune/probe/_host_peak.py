"""The peak resident (host) memory of this process over one probe.

Linux keeps each process's high-water mark of resident memory (``VmHWM`` in
``/proc/self/status``), and writing "5" to ``/proc/self/clear_refs`` resets it to the current
resident set (Linux 4.0 on; the kernel's Documentation/filesystems/proc.rst, "clear_refs"):
a warm rank resets it at each candidate's start, so each candidate gets its own peak. Where
the reset is refused (not Linux, a sandbox without clear_refs) a thread reads the resident
set every :data:`SAMPLE_PERIOD_S` instead (psutil), which may miss a peak shorter than that.

The mark and the thread are the process's own, so the meter is one per process
(:data:`METER`).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from autotune.measurement import HostPeakMethod

SAMPLE_PERIOD_S = 0.005
CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")
RESET_HIGH_WATER_MARK = "5"  # clear_refs: reset the peak resident set size
_HIGH_WATER_MARK = re.compile(r"^VmHWM:\s+(\d+)\s+kB$", re.MULTILINE)


def high_water_mark_bytes(status: Path = STATUS) -> int | None:
    """The kernel's high-water mark of this process's resident memory (None: not readable)."""
    try:
        match = _HIGH_WATER_MARK.search(status.read_text(encoding="ascii"))
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def reset_high_water_mark(clear_refs: Path = CLEAR_REFS) -> bool:
    """Reset the kernel's high-water mark to the resident memory now; False if refused."""
    try:
        clear_refs.write_text(RESET_HIGH_WATER_MARK, encoding="ascii")
    except OSError:
        return False
    return True


def resident_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class HostPeakMeter:
    """This process's peak resident memory since :meth:`start`, from the kernel's
    high-water mark where it can be reset, else sampled by a thread."""

    def __init__(self, clear_refs: Path = CLEAR_REFS, status: Path = STATUS) -> None:
        self._clear_refs = clear_refs
        self._status = status
        self.method: HostPeakMethod | None = None  # None: not started
        self._sampled_bytes = 0
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self) -> None:
        """Begin a new measurement (a sampler still running from the previous one ends)."""
        self._stop_sampler()
        readable = high_water_mark_bytes(self._status) is not None
        if readable and reset_high_water_mark(self._clear_refs):
            self.method = "kernel_hwm"
            return
        self.method = "sampled"
        self._sampled_bytes = resident_bytes()
        self._stop = threading.Event()
        self._sampler = threading.Thread(
            target=self._sample, name="autotune-host-peak", daemon=True
        )
        self._sampler.start()

    def _sample(self) -> None:
        import psutil

        process = psutil.Process()
        while not self._stop.wait(SAMPLE_PERIOD_S):
            self._sampled_bytes = max(self._sampled_bytes, int(process.memory_info().rss))

    def _stop_sampler(self) -> None:
        if self._sampler is not None:
            self._stop.set()
            self._sampler.join()
            self._sampler = None

    def peak(self) -> tuple[int, HostPeakMethod]:
        """The peak since :meth:`start` and how it was measured (a sampler stops here);
        never started: the resident memory now, ``at_end``."""
        if self.method == "kernel_hwm":
            mark = high_water_mark_bytes(self._status)
            if mark is not None:
                return mark, "kernel_hwm"
        if self.method != "sampled":  # never started, or the mark became unreadable
            return resident_bytes(), "at_end"
        self._stop_sampler()
        self._sampled_bytes = max(self._sampled_bytes, resident_bytes())
        return self._sampled_bytes, "sampled"


METER = HostPeakMeter()
