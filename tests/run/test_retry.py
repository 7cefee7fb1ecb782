"""``autotune run --study S --retry-failed``: failed candidates are probed once more (a
scripted executor stands in for probes here; tests/faults/test_faults.py retries a real
crashed probe)."""

from __future__ import annotations

import pytest

from autotune import events
from autotune.cli._render import line
from autotune.protocol import ProbeResult
from autotune.study import records
from tests.support.scripted import ScriptedExecutor, load_study, make_tuner

FP32_TWO_STAGES = (
    "precision: [fp32]\nzero_stage: [0, 1]\noffload_optimizer: [none]\noffload_param: [none]\n"
    "micro_batch_size: [8]\ngradient_accumulation_steps: [1]\nactivation_checkpointing: [false]\n"
)
BF16_OR_FP32 = FP32_TWO_STAGES.replace("[fp32]", "[fp32, bf16]").replace("[0, 1]", "[0, 1, 2]")


class FailingExecutor(ScriptedExecutor):
    """A :class:`ScriptedExecutor` whose probes of the labels containing one of ``failing``
    fail, as a script bug would (the same error each time)."""

    def __init__(self, rates: dict[str, list[float]], failing: tuple[str, ...] = ()) -> None:
        super().__init__(rates)
        self.failing = failing

    def submit(self, job) -> int:
        number = super().submit(job)
        if any(text in job.spec.candidate.label for text in self.failing):
            error = ProbeResult(
                status="error", error="RuntimeError: expected input dtype", wall_s=1.0
            )
            self._done[-1] = (number, error)
        return number


def _run(tmp_path, space: str, executor: ScriptedExecutor, **settings: object) -> list[object]:
    """One run of the study in ``tmp_path``; the events it emitted."""
    emitted: list[object] = []
    tuner = make_tuner(tmp_path, space, executor, budget_s=600, confirm=False, **settings)
    tuner.emit = emitted.append
    tuner.run()
    return emitted


def _by_status(tmp_path) -> dict[str, list[records.TrialView]]:
    grouped: dict[str, list[records.TrialView]] = {}
    for trial in records.views(load_study(tmp_path)):
        if trial.is_evaluation:
            grouped.setdefault(trial.status, []).append(trial)
    return grouped


RATES = {"z0 fp32 mb8x1": [100.0], "z1 fp32 mb8x1": [90.0]}


def test_retry_failed_probes_a_failed_candidate_once_more(tmp_path) -> None:
    _run(tmp_path, FP32_TWO_STAGES, FailingExecutor(RATES, failing=("z1",)))
    (failed,) = _by_status(tmp_path)["error"]
    assert failed.label == "z1 fp32 mb8x1"
    # a plain continuation never probes it twice
    again = FailingExecutor(RATES)
    _run(tmp_path, FP32_TWO_STAGES, again)
    assert again.order == []
    retried = FailingExecutor(RATES)
    emitted = _run(tmp_path, FP32_TWO_STAGES, retried, retry_failed=True)
    assert retried.order == ["z1 fp32 mb8x1"]
    requeued = [e for e in emitted if isinstance(e, events.FailedRequeued)]
    assert requeued == [events.FailedRequeued([failed.number])]
    assert line(requeued[0]) is not None
    assert f"requeued 1 failed candidate(s): trial(s) {failed.number}" in line(requeued[0])
    (ok,) = [t for t in _by_status(tmp_path)["ok"] if t.label == "z1 fp32 mb8x1"]
    assert ok.number > failed.number and ok.record.retry_of == failed.number
    assert ok.frozen.system_attrs["failed_trial"] == failed.number
    # nothing left to retry: said, and the run goes on
    emitted = _run(tmp_path, FP32_TWO_STAGES, FailingExecutor(RATES), retry_failed=True)
    (nothing,) = [e for e in emitted if isinstance(e, events.FailedRequeued)]
    assert nothing.trial_numbers == [] and "no failed candidate to retry" in str(line(nothing))
    assert any(isinstance(e, events.RunFinished) for e in emitted)


@pytest.mark.parametrize("sampler", ["grid", "autotune"])
def test_retry_failed_probes_the_candidates_a_stopped_precision_left_unprobed(
    tmp_path, sampler: str
) -> None:
    """Every bf16 probe failed alike, so bf16 was stopped: its failed candidates and those
    left unprobed are probed once more, the replayed failures stopping bf16 no more."""
    rates = {f"z{stage} {p} mb8x1": [100.0 - stage] for stage in range(3) for p in ("fp32", "bf16")}
    _run(tmp_path, BF16_OR_FP32, FailingExecutor(rates, failing=("bf16",)), sampler=sampler)
    before = _by_status(tmp_path)
    stopped = [t for t in before.get("pruned", []) if t.record.pruned_by == "bf16 stopped"]
    assert len(before["error"]) == 2 and len(stopped) == 1
    retried = FailingExecutor(rates)
    _run(tmp_path, BF16_OR_FP32, retried, retry_failed=True, sampler=sampler)
    assert sorted(retried.order) == sorted(t.label for t in [*before["error"], *stopped])
    assert {t.label for t in _by_status(tmp_path)["ok"]} == set(rates)
