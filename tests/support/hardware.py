"""A machine description for tests: two CPU devices."""

from __future__ import annotations

from autotune.hardware import Hardware

CPU = Hardware(
    accelerator="cpu",
    device_count=2,
    device_name="test CPU",
    device_memory_bytes=24 * 2**30,
    host_memory_bytes=24 * 2**30,
    cpu_count=2,
    precisions=("fp32", "bf16"),
)
