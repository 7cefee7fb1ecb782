"""The memory model of a user's script: learned from its probes.

autotune cannot build a script's model before running the script, so before its first probe
nothing is ruled out by the model (measured OOMs still rule out larger micro-batches). Each
probe reports the model the script handed to ``deepspeed.initialize`` (parameter count,
largest parameter) and the tensor bytes one micro-batch's forward left alive; from those:

- **model states** follow the ZeRO formulas of :meth:`autotune.memory.MemoryModel.model_states`
  (parameters, gradients, optimizer states per stage, precision and offload), as for
  built-in workloads;
- **activations** per sample are the forward's held bytes over its micro-batch (the
  smallest seen for a precision and checkpointing setting: a ZeRO-3 forward also holds
  gathered parameters), scaled by width to the other precision when only one was seen;
  this is DeepSpeed's own autotuner's linear model (``activation_mem_per_gpu`` x
  micro-batch);
- what DeepSpeed allocates on top (reduction buckets, flattened buffers, optimizer-step
  transients) is learned per shape (stage, precision, offload, knobs) as the measured peak
  less the model states and activations, the largest seen; for a shape no probe has had,
  the same stage's other precision, scaled by width; otherwise no prediction.

The peak of a candidate is model states + activations x micro-batch + that overhead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.memory import Breakdown, MemoryEstimate, MemoryModel, ModelFacts

if TYPE_CHECKING:
    from autotune.candidate import Candidate
    from autotune.protocol import ModelInfo
    from autotune.records import TrialView


def _width(precision: str) -> float:
    return 4.0 if precision == "fp32" else 2.0


def _overhead_key(candidate: Candidate, precision: str | None = None) -> str:
    """The candidate's shape for DeepSpeed's buffers: all but batch split and checkpointing."""
    return candidate.model_copy(
        update={
            "micro_batch_size": 1,
            "gradient_accumulation_steps": 1,
            "activation_checkpointing": False,
            "precision": precision or candidate.precision,
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
        self.per_sample: dict[tuple[str, bool], float] = {}  # (precision, ckpt) -> bytes
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
            key = (candidate.precision, candidate.activation_checkpointing)
            sample = activations / candidate.micro_batch_size
            self.per_sample[key] = min(self.per_sample.get(key, sample), sample)
        if peak_bytes > 0:
            self.measured.append((candidate, peak_bytes))

    def _states_bytes(self, candidate: Candidate) -> tuple[Breakdown, Breakdown, float]:
        assert self.states is not None
        device, host = self.states.model_states(candidate)
        tracked = device.total + (host.total if self.accelerator == "cpu" else 0.0)
        return device, host, tracked

    def activation_per_sample(self, candidate: Candidate) -> float | None:
        """Forward activation bytes per sample for the candidate's precision and
        checkpointing, or scaled from the other precision."""
        ckpt = candidate.activation_checkpointing
        found = self.per_sample.get((candidate.precision, ckpt))
        if found is not None:
            return found
        others = [
            value * _width(candidate.precision) / _width(precision)
            for (precision, other_ckpt), value in self.per_sample.items()
            if other_ckpt == ckpt
        ]
        return min(others) if others else None

    def overhead(self, candidate: Candidate) -> float | None:
        """Bytes beyond model states and activations, learned for the candidate's shape."""
        for precision in (candidate.precision, *("fp32", "bf16", "fp16")):
            key = _overhead_key(candidate, precision)
            seen = []
            for probed, peak in self.measured:
                if _overhead_key(probed) != key:
                    continue
                per_sample = self.activation_per_sample(probed) or 0.0
                states = self._states_bytes(probed)[2]
                seen.append(peak - states - per_sample * probed.micro_batch_size)
            if seen:
                return max(0.0, max(seen)) * _width(candidate.precision) / _width(precision)
        return None

    def predict(self, candidate: Candidate) -> MemoryEstimate | None:
        """The peak per rank, or None while the probes have not shown enough."""
        if self.states is None:
            return None
        per_sample = self.activation_per_sample(candidate)
        overhead = self.overhead(candidate)
        if per_sample is None or overhead is None:
            return None
        device, host, _ = self._states_bytes(candidate)
        extra = Breakdown(activations=per_sample * candidate.micro_batch_size, workspace=overhead)
        return MemoryEstimate(device=device.plus(extra), host=host, phase="learned")
