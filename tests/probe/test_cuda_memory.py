"""A CUDA rank's memory accounting, on CPU through :class:`FakeCudaMemory` and
:class:`FakeNvml` (the CUDA and NVML calls a CPU machine cannot make; the real ones run in
tests/integration/test_gpu_paths.py): script mode's limit and peak from the rank's start,
which DeepSpeed's peak resets cannot undo, its activation bytes from the allocator's
statistics; the memory outside the allocator, this process's (NVML, the GPU found by its
UUID) or the device's, measured again after the first step, and what a warm rank's earlier
candidates left there (a backend switch's communicators are no leftover)."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune.candidate import Candidate
from autotune.probe import _cuda_memory as cuda_memory
from autotune.probe import _script_probe, script_rank
from autotune.probe._cuda_memory import allocator_fraction
from autotune.probe._rank_process import record_peaks
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
        backend_config={},
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

    monkeypatch.setattr(_script_probe, "leave_now", leave_now)
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


def counting_accelerator_resets(monkeypatch) -> list[str]:
    """Calls that reach DeepSpeed's accelerator's own reset_peak_memory_stats (its class's
    method; the probe's guard shadows it on the accelerator object)."""
    from deepspeed.accelerator import get_accelerator

    kind = type(get_accelerator())
    real, calls = kind.reset_peak_memory_stats, []

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append("reset")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(kind, "reset_peak_memory_stats", counted)
    return calls


def test_deepspeed_cannot_reset_a_script_probes_peak(tmp_path, monkeypatch) -> None:
    """A script that reaches DeepSpeed's see_memory_usage(force=True) (the bf16 optimizer,
    memory_breakdown) would reset the accelerator's peak counters and undo the peak from
    the rank's start: while the script runs, the call does not reach the accelerator; after
    the run the accelerator's own method is back."""
    from deepspeed.runtime.utils import see_memory_usage

    fake = FakeCudaMemory(TOTAL, CONTEXT)
    fake.install(monkeypatch, nvml=False)
    resets = counting_accelerator_resets(monkeypatch)
    script = tmp_path / "train.py"
    script.write_text(
        "from deepspeed.runtime.utils import see_memory_usage\n"
        "see_memory_usage('as the bf16 optimizer does', force=True)\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(_script_probe, "leave_now", lambda *args: None)
    monkeypatch.setattr(script_rank.sys, "argv", list(script_rank.sys.argv))
    monkeypatch.setattr(script_rank.sys, "path", list(script_rank.sys.path))
    script_rank.run(cuda_spec(tmp_path, script), 0.0)
    assert resets == []
    see_memory_usage("outside a probe", force=True)
    assert resets == ["reset"]


def test_the_peak_guard_nests_and_gives_the_method_back(monkeypatch) -> None:
    from deepspeed.accelerator import get_accelerator

    from autotune.probe._peak_guard import peak_counters_kept

    resets = counting_accelerator_resets(monkeypatch)
    with peak_counters_kept():
        with peak_counters_kept():
            get_accelerator().reset_peak_memory_stats()
        get_accelerator().reset_peak_memory_stats()
    assert resets == []
    get_accelerator().reset_peak_memory_stats()
    assert resets == ["reset"]


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
    probe = _script_probe.ScriptProbe(spec, tmp_path / "spec.json", 0.0)
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


# -- memory outside the allocator ------------------------------------------------------------
OTHER_PROCESS = 3 * GiB  # another process on the same GPU


@pytest.fixture
def first_candidate(monkeypatch) -> None:
    """A fresh process: no earlier candidate's figures."""
    monkeypatch.setattr(cuda_memory, "_FIRST_LARGEST_BYTES", {})


def test_the_overhead_is_this_processs_where_nvml_lists_it(monkeypatch) -> None:
    """With NVML the overhead is this PID's used memory less the allocator's reserve (the
    other process on the GPU is not counted); without pynvml, or where NVML does not list
    this PID, the device-wide figure, which counts it, and the method says so."""
    device = torch.device("cuda", 0)
    fake = FakeCudaMemory(TOTAL, CONTEXT, other_process_bytes=OTHER_PROCESS)
    fake.install(monkeypatch, nvml=True)
    fake.allocate(2 * GiB)
    assert cuda_memory.cuda_overhead(device) == (CONTEXT, "process")
    fake.nvml_lists_this_process = False
    assert cuda_memory.cuda_overhead(device) == (CONTEXT + OTHER_PROCESS, "device")
    fake.install(monkeypatch, nvml=False)
    assert cuda_memory.cuda_overhead(device) == (CONTEXT + OTHER_PROCESS, "device")


def test_nccl_memory_of_the_first_step_is_in_the_limit_and_the_peak(
    tmp_path, monkeypatch, first_candidate
) -> None:
    """The first step connects DeepSpeed's groups (1 GiB more outside the allocator): the
    limit is set again from it right after that step, and the reported reserved peak is the
    allocator's peak plus the largest overhead."""
    device = torch.device("cuda", 0)
    fake = FakeCudaMemory(TOTAL, CONTEXT, communicator_bytes=200 * MiB)
    fake.install(monkeypatch, nvml=True)
    spec = ProbeSpec.model_validate_json(cuda_spec(tmp_path, tmp_path / "train.py").read_text())
    limit = cuda_memory.CudaMemoryLimit(spec, device)
    assert limit.start() == CONTEXT + 200 * MiB
    assert fake.fraction == pytest.approx(allocator_fraction(LIMIT, CONTEXT + 200 * MiB, TOTAL))

    def first_step() -> tuple[float, bool]:
        fake.allocate(4 * GiB)
        fake.outside_bytes += GiB  # ZeRO's collectives on DeepSpeed's groups
        return 1.0, False

    step = limit.after_first_step(first_step)
    assert step() == (1.0, False)
    overhead = CONTEXT + 200 * MiB + GiB
    assert fake.fraction == pytest.approx(allocator_fraction(LIMIT, overhead, TOTAL))
    fake.outside_bytes -= GiB // 2  # a later reading lower: the largest stays
    report = RankReport(rank=0, status="ok")
    record_peaks(report, None, device, limit)
    assert report.device_overhead_bytes == overhead
    assert report.peak_reserved_bytes == 4 * GiB + overhead
    assert report.overhead_at_start_bytes == CONTEXT + 200 * MiB
    assert report.overhead_method == "process"


def candidate_in_warm_rank(
    spec: ProbeSpec, fake: FakeCudaMemory, first_step: Any = None
) -> RankReport:
    """One candidate of a warm rank: its limit, its unclean check, a step (after
    ``first_step``, what the engine's first step connects), its peaks."""
    device = torch.device("cuda", 0)
    limit = cuda_memory.CudaMemoryLimit(spec, device)
    limit.start()
    report = RankReport(rank=0, status="ok", overhead_left_bytes=limit.left_bytes())

    def step() -> None:
        if first_step is not None:
            first_step()
        fake.allocate(GiB)

    limit.after_first_step(step)()
    record_peaks(report, None, device, limit)
    fake.free(GiB)
    return report


def test_a_warm_ranks_leftover_outside_the_allocator_is_counted_and_flagged(
    tmp_path, monkeypatch, first_candidate
) -> None:
    """What a later candidate finds outside the allocator beyond the first candidate's
    largest is reported (overhead_left_bytes, overhead_at_start_bytes); within the leak
    tolerance the rank probes on, beyond it the rank is unclean and its launcher restarts
    it; a communicator the first candidate also had (reused) is no leftover."""
    from autotune.execution.launch import unclean_bytes
    from autotune.probe._rank_memory import leak_tolerance_bytes
    from autotune.probe.rank import unclean_error

    fake = FakeCudaMemory(TOTAL, CONTEXT)
    fake.install(monkeypatch, nvml=True)
    spec = ProbeSpec.model_validate_json(cuda_spec(tmp_path, tmp_path / "train.py").read_text())
    tolerance = leak_tolerance_bytes(LIMIT)
    first = candidate_in_warm_rank(spec, fake)
    assert first.overhead_left_bytes == 0 and first.device_overhead_bytes == CONTEXT
    fake.outside_bytes += 100 * MiB  # a communicator the next candidate may not use
    second = candidate_in_warm_rank(spec, fake)
    assert second.overhead_at_start_bytes == CONTEXT + 100 * MiB
    assert second.overhead_left_bytes == 100 * MiB < tolerance
    assert unclean_error(second, tolerance) == ""
    fake.outside_bytes += tolerance  # more left: beyond the tolerance
    third = candidate_in_warm_rank(spec, fake)
    assert third.overhead_left_bytes == 100 * MiB + tolerance
    assert "outside the allocator" in unclean_error(third, tolerance)
    third.status = "unclean"
    assert unclean_bytes([third]) == 100 * MiB + tolerance


def test_a_backend_switch_in_a_warm_rank_is_no_leak(tmp_path, monkeypatch, first_candidate):
    """A warm rank whose first candidate was FSDP2's: its first DeepSpeed candidate makes
    DeepSpeed's copy of the world group (a communicator DeepSpeed keeps and reuses), which
    the candidates after it find outside the allocator at their start. That is no leftover
    (the rank probes on, whichever backend comes next); memory left beyond it still is."""
    from autotune.probe._rank_memory import leak_tolerance_bytes
    from autotune.probe.rank import unclean_error

    fake = FakeCudaMemory(TOTAL, CONTEXT)
    fake.install(monkeypatch, nvml=True)
    spec = ProbeSpec.model_validate_json(cuda_spec(tmp_path, tmp_path / "train.py").read_text())
    fsdp2_candidate = spec.candidate.model_dump() | {"backend": "fsdp2", "zero_stage": 3}
    fsdp2 = spec.model_copy(update={"candidate": Candidate.model_validate(fsdp2_candidate)})
    tolerance = leak_tolerance_bytes(LIMIT)
    world_copy = tolerance + 400 * MiB  # NCCL's buffers of a group on 8 GPUs can exceed it
    assert candidate_in_warm_rank(fsdp2, fake).overhead_left_bytes == 0

    def deepspeed_first_step() -> None:
        if fake.outside_bytes == CONTEXT:  # the copy is made once, then reused
            fake.outside_bytes += world_copy

    for candidate_spec in (spec, spec, fsdp2):
        report = candidate_in_warm_rank(candidate_spec, fake, deepspeed_first_step)
        assert report.overhead_left_bytes == 0 and unclean_error(report, tolerance) == ""
    assert report.overhead_at_start_bytes == CONTEXT + world_copy
    fake.outside_bytes += tolerance + MiB  # a leftover beyond the communicators kept
    leaking = candidate_in_warm_rank(spec, fake)
    assert leaking.overhead_left_bytes == tolerance + MiB
    assert "outside the allocator" in unclean_error(leaking, tolerance)


class FakeNvml:
    """NVML on a machine of two GPUs (a CPU machine has none): ``pynvml`` numbering them in
    PCI bus order with their UUIDs and compute processes, and torch's
    ``get_device_properties`` numbering them as the CUDA runtime does, in
    ``CUDA_DEVICE_ORDER`` (fastest first unless ``PCI_BUS_ID``) then ``CUDA_VISIBLE_DEVICES``.
    This process runs on the GPU that CUDA calls device 0."""

    UUIDS = ("11111111-0000-0000-0000-000000000000", "22222222-0000-0000-0000-000000000000")
    FASTEST_FIRST = (1, 0)  # the GPU at PCI bus position 1 is the faster one
    MINE = 700 * MiB  # what NVML lists for this process

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch

    def cuda_order(self) -> list[int]:
        """PCI positions of the GPUs CUDA numbers 0, 1, ..."""
        pci_order = os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
        order = [0, 1] if pci_order else list(self.FASTEST_FIRST)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        return order if visible is None else [order[int(i)] for i in visible.split(",")]

    def install(self) -> None:
        mine = self.cuda_order()[0]
        module = types.ModuleType("pynvml")

        class NVMLError(Exception):
            pass

        def by_uuid(name: bytes) -> int:
            for position, uuid in enumerate(self.UUIDS):
                if name == f"GPU-{uuid}".encode():
                    return position
            raise NVMLError("NVML_ERROR_NOT_FOUND")

        def processes(position: int) -> list[Any]:
            if position != mine:
                return [types.SimpleNamespace(pid=1, usedGpuMemory=GiB)]  # another process
            return [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=self.MINE)]

        module.NVMLError = NVMLError  # type: ignore[attr-defined]
        module.nvmlInit = lambda: None  # type: ignore[attr-defined]
        module.nvmlDeviceGetHandleByIndex = lambda position: position  # type: ignore[attr-defined]
        module.nvmlDeviceGetHandleByUUID = by_uuid  # type: ignore[attr-defined]
        module.nvmlDeviceGetComputeRunningProcesses = processes  # type: ignore[attr-defined]
        self.monkeypatch.setitem(sys.modules, "pynvml", module)

        def properties(device: Any = None) -> Any:
            index = getattr(device, "index", device) or 0
            position = self.cuda_order()[index]
            return types.SimpleNamespace(total_memory=TOTAL, uuid=self.UUIDS[position])

        self.monkeypatch.setattr(torch.cuda, "get_device_properties", properties)


@pytest.mark.parametrize(
    ("order", "visible"),
    [(None, None), (None, "1"), ("PCI_BUS_ID", "1"), ("PCI_BUS_ID", None)],
)
def test_nvml_reads_the_gpu_cuda_runs_on(monkeypatch, order, visible) -> None:
    """NVML numbers GPUs in PCI bus order, CUDA fastest first unless CUDA_DEVICE_ORDER says
    PCI_BUS_ID: the rank's GPU is found in NVML by its UUID, so the per-process reading is
    this process's on its own GPU in every order."""
    for name, value in (("CUDA_DEVICE_ORDER", order), ("CUDA_VISIBLE_DEVICES", visible)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    FakeNvml(monkeypatch).install()
    assert cuda_memory.process_used_bytes(torch.device("cuda", 0)) == FakeNvml.MINE


@pytest.mark.parametrize("uuid", ["33333333-0000-0000-0000-000000000000", ""])
def test_a_gpu_nvml_cannot_name_has_no_process_figure(monkeypatch, uuid) -> None:
    """A UUID NVML does not know, or none from torch: no per-process figure (the reading
    is then device-wide), never another GPU's."""
    FakeNvml(monkeypatch).install()
    properties = types.SimpleNamespace(total_memory=TOTAL, uuid=uuid)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)
    assert cuda_memory.process_used_bytes(torch.device("cuda", 0)) is None
