"""A rank's peak resident memory: the kernel's high-water mark, reset per candidate, and the
sampled fallback where the reset is refused. Real memory of real processes on this Linux
machine: nothing here is faked."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from autotune.probe._host_peak import CLEAR_REFS, HostPeakMeter, resident_bytes
from tests.support.paths import ROOT

MIB = 2**20
HELD_BYTES = 200 * MIB

# In a fresh interpreter (its memory is its own): 200 MiB written and freed between two
# readings of the meter, and the resident set after each step.
HIGH_WATER_MARK = f"""
import json
from autotune.probe._host_peak import HostPeakMeter, resident_bytes

meter = HostPeakMeter()
meter.start()
before = resident_bytes()
block = bytearray({HELD_BYTES})  # written (zeroed) page by page: resident
held = resident_bytes()
del block  # an mmap'd block: unmapped at once
peak, method = meter.peak()
freed = resident_bytes()
meter.start()
after_reset, reset_method = meter.peak()
print(json.dumps(dict(before=before, held=held, peak=peak, method=method, freed=freed,
                      after_reset=after_reset, reset_method=reset_method)))
"""


def _clear_refs_usable() -> bool:
    try:
        CLEAR_REFS.write_text("5", encoding="ascii")
    except OSError:
        return False
    return True


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _clear_refs_usable(),
    reason="the kernel's high-water mark reset needs Linux with /proc/self/clear_refs",
)
def test_the_high_water_mark_holds_a_freed_allocation_until_the_reset() -> None:
    out = subprocess.run(
        [sys.executable, "-c", HIGH_WATER_MARK],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    seen = json.loads(out.stdout)
    assert seen["method"] == seen["reset_method"] == "kernel_hwm"
    assert seen["held"] - seen["before"] >= 0.95 * HELD_BYTES  # the block was resident
    assert seen["freed"] < seen["held"] - 0.9 * HELD_BYTES  # and is gone
    # the mark holds what is gone: the peak, not the resident memory at the end (the
    # kernel's per-CPU counters of resident pages are read approximately: a page or so)
    assert seen["peak"] >= seen["held"] - MIB
    assert seen["peak"] - seen["freed"] >= 0.9 * HELD_BYTES
    # the reset starts the next candidate from the resident memory of now
    assert seen["after_reset"] < seen["peak"] - 0.9 * HELD_BYTES


def _hold() -> tuple[int, int]:
    """Hold 200 MiB for a while, then free them: (resident memory before, while held)."""
    before = resident_bytes()
    block = bytearray(HELD_BYTES)
    held = resident_bytes()
    time.sleep(0.3)  # many sampling periods
    del block
    return before, held


def test_where_the_reset_is_refused_a_thread_samples_the_resident_memory(tmp_path: Path) -> None:
    refused = tmp_path / "no-such-folder" / "clear_refs"  # writing it fails as a refusal does
    meter = HostPeakMeter(clear_refs=refused)
    meter.start()
    assert meter.method == "sampled"
    samplers = [t for t in threading.enumerate() if t.name == "autotune-host-peak"]
    assert len(samplers) == 1 and samplers[0].daemon
    before, held = _hold()
    assert held - before >= 0.95 * HELD_BYTES
    peak, method = meter.peak()
    assert method == "sampled"
    assert peak >= held - 5 * MIB  # the sampled peak saw the block, which is gone now
    assert peak - resident_bytes() >= 0.9 * HELD_BYTES
    # the sampler ends with the reading; a new start begins a new measurement
    assert not samplers[0].is_alive()
    meter.start()
    again, _ = meter.peak()
    assert again < peak - 0.9 * HELD_BYTES


def test_without_the_kernels_status_the_meter_samples(tmp_path: Path) -> None:
    meter = HostPeakMeter(status=tmp_path / "status")  # not Linux: no VmHWM to read
    meter.start()
    assert meter.method == "sampled"
    assert meter.peak()[1] == "sampled"


def test_a_meter_never_started_says_it_read_the_end() -> None:
    bytes_now, method = HostPeakMeter().peak()
    assert method == "at_end" and bytes_now > 0
