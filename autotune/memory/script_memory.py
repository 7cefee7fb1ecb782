"""The memory model of a user's script: learned from its probes.

autotune cannot build a script's model before running the script, so before its first probe
nothing is ruled out by the model (measured OOMs still rule out larger micro-batches). Each
probe reports the model the script handed to ``deepspeed.initialize`` (parameter count,
largest parameter) and the tensor bytes one micro-batch's forward left alive; from those:

- **model states** follow the ZeRO formulas of :meth:`autotune.memory.MemoryModel.model_states`
  (parameters, gradients, optimizer states per stage, precision and offload), as for
  built-in workloads;
- **activations** are the bytes a forward left alive, on a line over the micro-batch fitted
  to the forwards seen for the candidate's precision and checkpointing (through the origin
  from one micro-batch, as DeepSpeed's own autotuner extrapolates ``activation_mem_per_gpu``;
  ZeRO-3 forwards also hold gathered parameters and count only when there is nothing
  else), scaled by width from the other precision when only that one was seen;
- what DeepSpeed allocates on top (reduction buckets, flattened buffers, gradients held
  across accumulation, optimizer-step transients) is learned per shape (stage, precision,
  offload, knobs, whether it accumulates) as the measured peak less the model states and
  activations, the largest seen; for a shape no probe has had, the same shape with or
  without accumulation, or the same stage's other precision scaled by width; otherwise no
  prediction.

The peak of a candidate is model states + activations x micro-batch + that overhead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.memory.memory_model import Breakdown, MemoryEstimate, MemoryModel, ModelFacts

if TYPE_CHECKING:
    from autotune.candidate import Candidate
    from autotune.protocol import ModelInfo
    from autotune.study import TrialView


def _width(precision: str) -> float:
    return 4.0 if precision == "fp32" else 2.0


def _overhead_key(candidate: Candidate) -> str:
    """The candidate's shape for DeepSpeed's buffers: all but micro-batch and checkpointing,
    and of accumulation only whether there is any (ZeRO 0-2 then hold gradients across
    micro-batches)."""
    return candidate.model_copy(
        update={
            "micro_batch_size": 1,
            "gradient_accumulation_steps": min(candidate.gradient_accumulation_steps, 2),
            "checkpoint_fraction": 0.0,
        }
    ).key


class _StatesModel(MemoryModel):
    """The ZeRO model-state formulas over facts a probe reported (no workload to build)."""

    def __init__(self, facts: ModelFacts, base_config: dict[str, Any] | None) -> None:
        super().__init__(None, base_config=base_config)  # type: ignore[arg-type]
        self._given = facts

    def facts(self, candidate: Candidate) -> ModelFacts:
        return self._given


def read_probe(trial_dir: str) -> tuple[ModelInfo | None, int]:
    """The model and the largest per-rank forward activation bytes the probe's ranks
    reported in ``trial_dir``."""
    from autotune.protocol import RankReport

    model, activations = None, 0
    for path in sorted(Path(trial_dir).glob("rank-*.json")):
        try:
            report = RankReport.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
        model = model or report.model
        activations = max(activations, report.activation_bytes)
    return model, activations


class ScriptMemoryModel:
    """Predicts a script candidate's peak per rank from what its probes measured."""

    def __init__(self, accelerator: str, base_config: dict[str, Any] | None = None) -> None:
        self.accelerator = accelerator
        self.base_config = base_config
        self.states: _StatesModel | None = None
        # (precision, checkpointing) -> (micro-batch, forward-held bytes, ZeRO stage) seen
        self.forwards: dict[tuple[str, bool], list[tuple[int, float, int]]] = {}
        self.measured: list[tuple[Candidate, int]] = []  # (candidate, measured peak)

    def learn(self, trial: TrialView) -> None:
        """Take the model, activations and peak of one probe (ok or OOM)."""
        record = trial.record
        if record.candidate is None or not record.trial_dir:
            return
        model, activations = read_probe(record.trial_dir)
        self.learn_probe(record.candidate, trial.status, model, activations, record.peak_bytes)

    def learn_probe(
        self,
        candidate: Candidate,
        status: str,
        model: ModelInfo | None,
        activations: int,
        peak_bytes: int,
    ) -> None:
        if model is not None and self.states is None:
            facts = ModelFacts(
                params=model.params,
                largest_param=model.largest_param,
                small_params=model.small_params,
            )
            self.states = _StatesModel(facts, self.base_config)
        if status != "ok":
            return
        if activations > 0:
            key = (candidate.precision, candidate.checkpoint_fraction)
            seen = (candidate.micro_batch_size, float(activations), candidate.zero_stage)
            self.forwards.setdefault(key, []).append(seen)
        if peak_bytes > 0:
            self.measured.append((candidate, peak_bytes))

    def _states_bytes(self, candidate: Candidate) -> tuple[Breakdown, Breakdown, float]:
        assert self.states is not None
        device, host = self.states.model_states(candidate)
        tracked = device.total + (host.total if self.accelerator == "cpu" else 0.0)
        return device, host, tracked

    def activations(self, candidate: Candidate) -> float | None:
        """Forward activation bytes of the candidate's micro-batch: a line through what
        forwards of its precision and checkpointing held (ZeRO-3's, which also hold
        gathered parameters, only when there is nothing else), or the other precision's
        scaled by width."""
        ckpt, mb = candidate.checkpoint_fraction, candidate.micro_batch_size
        for precision in (candidate.precision, "fp32", "bf16", "fp16"):
            points = self.forwards.get((precision, ckpt), [])
            points = [p for p in points if p[2] != 3] or points
            if points:
                scale = _width(candidate.precision) / _width(precision)
                return scale * _line(points, mb)
        return None

    def overhead(self, candidate: Candidate) -> float | None:
        """Bytes beyond model states and activations, learned for the candidate's shape;
        else for it with or without accumulation; else the same stage's other precision's,
        scaled by width (BF16_Optimizer's fp32 buffers do not scale: a last resort)."""
        for key, scale in self._overhead_keys(candidate):
            seen = [
                peak - self._states_bytes(probed)[2] - (self.activations(probed) or 0.0)
                for probed, peak in self.measured
                if _overhead_key(probed) == key
            ]
            if seen:
                return max(0.0, max(seen)) * scale
        return None

    @staticmethod
    def _overhead_keys(candidate: Candidate) -> list[tuple[str, float]]:
        keys = []
        for precision in dict.fromkeys((candidate.precision, "fp32", "bf16", "fp16")):
            for gas in dict.fromkeys((candidate.gradient_accumulation_steps > 1, True, False)):
                scale = _width(candidate.precision) / _width(precision)
                shaped = candidate.model_copy(
                    update={"precision": precision, "gradient_accumulation_steps": 2 if gas else 1}
                )
                keys.append((_overhead_key(shaped), scale))
        return keys

    def predict(self, candidate: Candidate) -> MemoryEstimate | None:
        """The peak per rank, or None while the probes have not shown enough."""
        if self.states is None:
            return None
        activations = self.activations(candidate)
        overhead = self.overhead(candidate)
        if activations is None or overhead is None:
            return None
        device, host, _ = self._states_bytes(candidate)
        extra = Breakdown(activations=activations, workspace=overhead)
        return MemoryEstimate(device=device.plus(extra), host=host, phase="learned")


def _line(points: list[tuple[int, float, int]], micro_batch: int) -> float:
    """Held bytes at ``micro_batch`` on the least-squares line through (micro-batch, bytes)
    (through the origin when one micro-batch was seen); never negative."""
    xs = [float(p[0]) for p in points]
    ys = [p[1] for p in points]
    if len(set(xs)) < 2:
        return max(0.0, sum(ys) / sum(xs) * micro_batch)
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    slope = max(0.0, slope)
    return max(0.0, mean_y + slope * (micro_batch - mean_x))
