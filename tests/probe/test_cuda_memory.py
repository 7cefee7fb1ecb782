"""A CUDA rank's memory accounting, on CPU through :class:`FakeCudaMemory` (the CUDA calls a
CPU build of torch cannot make; the real ones run in tests/integration/test_gpu_paths.py):
script mode's limit and peak from the rank's start, its activation bytes from the
allocator's statistics."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.candidate import Candidate
from autotune.probe import script_rank
from autotune.probe._cuda_memory import allocator_fraction
from autotune.protocol import ProbeSpec, RankReport, ScriptRun
from tests.support.fake_cuda import FakeCudaMemory

GiB, MiB = 2**30, 2**20
TOTAL = 80 * GiB
LIMIT = 24 * GiB
CONTEXT = 500 * MiB  # the CUDA context and cuBLAS, outside the allocator
MICRO_BATCH = 4


class Left(Exception):
    """``leave_now`` was reached (the real one ends the process)."""


def cuda_spec(tmp_path: Path, script: Path) -> Path:
    spec = ProbeSpec(
        workload=str(script),
        candidate=Candidate(
            precision="fp32",
            zero_stage=0,
            micro_batch_size=MICRO_BATCH,
            gradient_accumulation_steps=1,
            data_parallel_size=1,
        ),
        ds_config={},
        accelerator="cuda",
        vram_limit_bytes=LIMIT,
        device_memory_bytes=TOTAL,
        script=ScriptRun(path=str(script), argv=[str(tmp_path / "seen.json")]),
    )
    path = tmp_path / "spec.json"
    path.write_text(spec.model_dump_json(), encoding="utf-8")
    return path


def test_a_script_runs_under_the_cuda_limit_from_the_ranks_start(tmp_path, monkeypatch) -> None:
    """The limit and the peak reset come before the script's first line: the script sees
    the allocator's fraction set (the limit less the context) and a peak of what it holds,
    and what it allocates before deepspeed.initialize is under that limit."""
    fake = FakeCudaMemory(TOTAL, CONTEXT)
    fake.allocate(3 * GiB)
    fake.free(3 * GiB)  # a peak from before the rank's start, which must not count
    fake.install(monkeypatch, nvml=False)
    script = tmp_path / "train.py"
    script.write_text(
        "import json, sys, torch\n"
        "seen = {'fraction': torch.cuda.get_per_process_memory_fraction(0),\n"
        "        'peak': torch.cuda.max_memory_allocated(0)}\n"
        "json.dump(seen, open(sys.argv[1], 'w'))\n",
        encoding="utf-8",
    )
    left: list[RankReport] = []

    def leave_now(report: RankReport, spec_path: Path, started: float) -> None:
        left.append(report)
        raise Left

    monkeypatch.setattr(script_rank, "leave_now", leave_now)
    monkeypatch.setattr(script_rank.sys, "argv", list(script_rank.sys.argv))
    monkeypatch.setattr(script_rank.sys, "path", list(script_rank.sys.path))
    with pytest.raises(Left):
        script_rank.run(cuda_spec(tmp_path, script), 0.0)
    seen = json.loads((tmp_path / "seen.json").read_text(encoding="utf-8"))
    assert seen["fraction"] == pytest.approx(allocator_fraction(LIMIT, CONTEXT, TOTAL))
    assert seen["peak"] == 0
    assert fake.events.index("reset_peak_memory_stats") < fake.events.index(
        "set_per_process_memory_fraction"
    )
    assert "ended without calling deepspeed.initialize" in left[0].error
    # what the script would allocate on the device now is limited: the limit less the context
    with pytest.raises(torch.OutOfMemoryError):
        fake.allocate(LIMIT - CONTEXT + MiB)


class AllocatingModule(torch.nn.Module):
    """A model whose forward keeps ``held_bytes`` of activations on the fake device."""

    def __init__(self, fake: FakeCudaMemory, held_bytes: int) -> None:
        super().__init__()
        self.fake, self.held_bytes = fake, held_bytes

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        self.fake.allocate(self.held_bytes)
        return batch


def test_a_forward_on_cuda_reports_the_allocators_delta(tmp_path, monkeypatch) -> None:
    """On CUDA the activation bytes are memory_allocated after the engine module's forward
    less before it, the largest over warm-up; forwards of timed steps do not count."""
    fake = FakeCudaMemory(TOTAL, CONTEXT)
    fake.install(monkeypatch, nvml=False)
    fake.allocate(2 * GiB)  # model states, held before and after the forward
    spec = ProbeSpec.model_validate_json(cuda_spec(tmp_path, tmp_path / "train.py").read_text())
    probe = script_rank.ScriptProbe(spec, tmp_path / "spec.json", 0.0)
    probe.device = torch.device("cuda", 0)
    module = AllocatingModule(fake, 300 * MiB)
    engine: Any = types.SimpleNamespace(
        module=module, step=lambda: None, is_gradient_accumulation_boundary=lambda: True
    )
    probe._attach(engine)
    batch = torch.zeros(MICRO_BATCH, 8)
    engine.module(batch)
    assert probe.report.activation_bytes == 300 * MiB
    module.held_bytes = 100 * MiB  # a smaller forward keeps the largest
    engine.module(batch)
    assert probe.report.activation_bytes == 300 * MiB
    probe.timing = True  # timed steps: not measured
    module.held_bytes = GiB
    engine.module(batch)
    assert probe.report.activation_bytes == 300 * MiB
