"""Folding rank reports into one probe result: status precedence and throughput."""

from __future__ import annotations

import pytest

from autotune.candidate import Candidate
from autotune.protocol import ProbeSpec, RankReport
from autotune.rank_outcome import aggregate, torchrun_root_cause

CANDIDATE = Candidate(
    precision="fp32",
    zero_stage=2,
    micro_batch_size=4,
    gradient_accumulation_steps=2,
    data_parallel_size=2,
)
SPEC = ProbeSpec(
    workload="gpt-tiny",
    candidate=CANDIDATE,
    backend_config={},
    accelerator="cpu",
    vram_limit_bytes=100,
    device_memory_bytes=1000,
    tokens_per_sample=64,
)


def _fold(reports, **kwargs):
    defaults = {"world_size": 2, "exit_code": 0, "timed_out": False, "wall_s": 10.0, "log_tail": ""}
    return aggregate(SPEC, reports, **{**defaults, **kwargs})


def test_ok_uses_the_slowest_rank_per_step() -> None:
    reports = [
        RankReport(rank=0, status="ok", step_times_s=[1.0, 2.0, 1.0], peak_allocated_bytes=50),
        RankReport(rank=1, status="ok", step_times_s=[1.5, 1.0, 0.5], peak_allocated_bytes=60),
    ]
    result = _fold(reports)
    assert result.status == "ok"
    assert result.step_times_s == [1.5, 2.0, 1.0]
    assert result.step_time_s == 1.5
    assert result.samples_per_s == pytest.approx(16 / 1.5)
    assert result.tokens_per_s == pytest.approx(16 * 64 / 1.5)
    assert result.samples_per_s_min == pytest.approx(8.0)
    assert result.samples_per_s_max == pytest.approx(16.0)
    assert result.peak_bytes_per_rank == [50, 60]
    assert result.peak_bytes == 60
    assert result.timed_s == pytest.approx(4.5)


def test_oom_on_one_rank_wins_over_everything() -> None:
    reports = [RankReport(rank=1, status="oom", error="CUDA out of memory")]
    result = _fold(reports, exit_code=1, timed_out=True)
    assert result.status == "oom"
    assert result.error == "rank 1: CUDA out of memory"


def test_timeout_and_error() -> None:
    assert _fold([], exit_code=None, timed_out=True).status == "timeout"
    both = [
        RankReport(rank=1, status="error", error="bang"),
        RankReport(rank=0, status="error", error="boom"),
    ]
    error = _fold(both, exit_code=1)
    assert (error.status, error.error) == ("error", "rank 0: boom")
    # One rank reported an error, the other died without a report: the dead one is the
    # cause, the survivor's error is named after it.
    partial = _fold([RankReport(rank=0, status="error", error="boom")], exit_code=1)
    assert partial.status == "error"
    assert partial.error.startswith("probe exited with code 1; rank(s) [1] wrote no report")
    assert partial.error.endswith("then rank 0: boom")


def test_crash_names_the_rank_from_torchrun() -> None:
    log = """
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_18:47:30
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 3583)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 3583
=====
"""
    result = _fold([RankReport(rank=0, status="ok", step_times_s=[1.0])], exit_code=1, log_tail=log)
    assert result.status == "error"
    assert "rank(s) [1] wrote no report" in result.error
    assert "rank 1 died first with exit code -9 (Signal 9 (SIGKILL)" in result.error
    assert torchrun_root_cause("no failure here") == ""


def test_the_rank_without_a_report_died_first_whatever_torchrun_observed() -> None:
    """torchrun polled the survivor first (it failed on the broken connection) and named it
    the root cause; the SIGKILLed rank, which wrote no report, is the cause."""
    log = """
Failures:
[1]:
  time      : 2026-12-01_00:21:44
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 9025)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 9025
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_00:21:44
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 9024)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
=====
"""
    survivor = RankReport(rank=0, status="error", error="RuntimeError: Connection closed")
    result = _fold([survivor], exit_code=1, log_tail=log)
    assert "rank 1 died first with exit code -9 (Signal 9 (SIGKILL)" in result.error
    assert result.error.endswith("then rank 0: RuntimeError: Connection closed")
    assert torchrun_root_cause(log) == "rank 0 died first with exit code 1"


def test_a_rank_torchrun_stopped_is_not_the_cause() -> None:
    """Neither rank wrote a report: torchrun SIGTERMed rank 0 after rank 1 was SIGKILLed
    (and may list rank 0 as its root cause); rank 1 is named."""
    log = """
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 12600)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 12600
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 12599)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 12599
=====
"""
    result = _fold([], exit_code=1, log_tail=log)
    assert "rank(s) [0, 1] wrote no report" in result.error
    assert "rank 1 died first with exit code -9" in result.error


def test_host_peaks_fold_per_node_with_the_least_exact_method() -> None:
    def rank(r: int, node: str, peak: int, method: str) -> RankReport:
        return RankReport(
            rank=r,
            status="ok",
            step_times_s=[1.0],
            host_peak_bytes=peak,
            host_peak_method=method,
            node=node,
        )

    result = _fold(
        [
            rank(1, "b", 20, "kernel_hwm"),
            rank(0, "a", 10, "kernel_hwm"),
            rank(2, "a", 5, "sampled"),
        ],
        world_size=3,
    )
    assert result.host_peak_bytes_per_rank == [10, 20, 5]
    assert result.node_per_rank == ["a", "b", "a"]
    assert result.host_peak_per_node() == {"a": 15, "b": 20}
    assert result.host_peak_method == "sampled"  # one sampled rank qualifies them all
    both = _fold([rank(0, "a", 1, "kernel_hwm"), rank(1, "a", 2, "kernel_hwm")])
    assert both.host_peak_method == "kernel_hwm" and both.host_peak_per_node() == {"a": 3}


def test_a_rank_report_written_before_host_peaks_were_measured_still_reads() -> None:
    old = RankReport.model_validate({"rank": 0, "status": "ok", "host_peak_bytes": 7})
    assert (old.host_peak_method, old.node) == ("at_end", "")
