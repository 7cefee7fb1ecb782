"""DeepSpeed as a :class:`~autotune.backends.TrainingBackend`: each member hands over to the
module of this package that does that job."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from autotune import events
from autotune.backends.deepspeed import _ds_config, _engine, _model_states, _validate, _zero_phases

if TYPE_CHECKING:
    from autotune.backends._memory_terms import ActivationProfile, Breakdown, ModelFacts
    from autotune.backends.deepspeed.ops import OpsReport
    from autotune.candidate import Candidate
    from autotune.hardware import Hardware


class DeepSpeedBackend:
    """DeepSpeed 0.19: ZeRO stages 0-3 with CPU and NVMe offload, its JIT ops."""

    name = "deepspeed"
    config_file_name = "ds_config.json"

    def render_config(
        self,
        candidate: Candidate,
        base: dict[str, Any] | None = None,
        *,
        nvme_path: str | None = None,
        largest_param_numel: int | None = None,
    ) -> dict[str, Any]:
        return _ds_config.render_ds_config(
            candidate, base, nvme_path=nvme_path, largest_param_numel=largest_param_numel
        )

    def ensure_ops(
        self,
        hardware: Hardware,
        offload_targets: Iterable[str] | None = None,
        emit: events.Emit = events.ignore,
    ) -> OpsReport:
        from autotune.backends.deepspeed.ops import ensure_deepspeed_ops

        return ensure_deepspeed_ops(hardware, offload_targets=offload_targets, emit=emit)

    def sharded_build(
        self, candidate: Candidate, config: dict[str, Any]
    ) -> contextlib.AbstractContextManager[Any] | None:
        return _engine.sharded_build(candidate, config)

    def initialize_engine(self, model: Any, config: dict[str, Any]) -> Any:
        return _engine.initialize_engine(model, config)

    def model_states(self, candidate: Candidate, facts: ModelFacts) -> tuple[Breakdown, Breakdown]:
        return _model_states.zero_model_states(candidate, facts)

    def transient_phases(
        self,
        candidate: Candidate,
        facts: ModelFacts,
        act: ActivationProfile,
        knobs: dict[str, int],
        host: Breakdown,
    ) -> tuple[dict[str, Breakdown], Breakdown]:
        return _zero_phases.transient_phases(candidate, facts, act, knobs, host)

    def validate_config(
        self, config: dict[str, Any], world_size: int, accelerator: str = "cpu"
    ) -> None:
        _validate.validate_ds_config(config, world_size, accelerator)
