"""The GPU check's optional activation-offload measurement: off unless asked, outside the
time plan, and skipped with its reason where the ranks are not CUDA."""

from __future__ import annotations

import io
from pathlib import Path

from benchmarks.gpu_check._activation_offload_phase import measure_activation_offload
from benchmarks.gpu_check._driver import parse_args, settings_for
from benchmarks.gpu_check._run import Run


def test_it_is_off_by_default_and_outside_the_plan() -> None:
    plain = parse_args(["out"])
    asked = parse_args(["out", "--activation-offload"])
    assert not plain.activation_offload and asked.activation_offload
    assert settings_for(asked).timeouts == settings_for(plain).timeouts
    assert settings_for(asked).total_s == settings_for(plain).total_s


def test_without_cuda_it_is_skipped_with_the_reason(tmp_path: Path) -> None:
    args = parse_args([str(tmp_path), "--dry-run", "--activation-offload"])
    console = io.StringIO()
    run = Run(args=args, settings=settings_for(args), out=tmp_path, work=tmp_path, console=console)
    run.facts["accelerator"] = "cpu"
    measure_activation_offload(run)
    assert run.facts["activation_offload"] == {
        "skipped": "no CUDA device: host and device are one memory"
    }
    assert "activation_offload (outside the plan): skipped" in console.getvalue()
    assert not run.phases
