"""DeepSpeed as a :class:`~autotune.backends.TrainingBackend`: each member hands over to the
module of this package that does that job."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from autotune import events
from autotune.backends.deepspeed import (
    _ds_config,
    _engine,
    _export_text,
    _model_states,
    _validate,
    _zero_phases,
)

if TYPE_CHECKING:
    from autotune.backends._memory_terms import ActivationProfile, Breakdown, ModelFacts
    from autotune.backends.deepspeed.ops import OpsReport
    from autotune.candidate import Candidate
    from autotune.hardware import Hardware
    from autotune.script_config import ScriptConfig


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

    def prepare_rank_process(self) -> None:
        from autotune.backends.deepspeed.ops import guard_op_loads

        guard_op_loads()  # a killed loader's leftover lock is cleared

    def start_process_group(self) -> None:
        import deepspeed

        deepspeed.init_distributed()

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

    def with_fallback_optimizer(self, config: dict[str, Any]) -> dict[str, Any]:
        from autotune.backends.deepspeed.ops import use_torch_adam

        return use_torch_adam(config)

    def uses_fallback_optimizer(self, config: dict[str, Any]) -> bool:
        return bool(config.get("optimizer", {}).get("params", {}).get("torch_adam"))

    def nvme_offload_problem(self, hardware: Hardware) -> str | None:
        from autotune.backends.deepspeed.ops import async_io_problem

        return async_io_problem(hardware)

    def partial_offload_supported(self) -> bool:
        from autotune.backends.deepspeed.ops import partial_offload_supported

        return partial_offload_supported()

    def config_for_script(self, config: dict[str, Any], script: ScriptConfig) -> dict[str, Any]:
        return _ds_config.script_ds_config(config, script)

    def launch_script(
        self, origin: str, ranks: int, accelerator: str, threads_per_rank: int
    ) -> str:
        return _export_text.launch_script(origin, ranks, accelerator, threads_per_rank)

    def script_launch_script(
        self,
        *,
        origin: str,
        script_name: str,
        script_path: str,
        cwd: str,
        shell_args: str,
        passes_config: bool,
        ranks: int,
        accelerator: str,
        threads_per_rank: int,
    ) -> str:
        return _export_text.script_launch_script(
            origin=origin,
            script_name=script_name,
            script_path=script_path,
            cwd=cwd,
            shell_args=shell_args,
            passes_config=passes_config,
            ranks=ranks,
            accelerator=accelerator,
            threads_per_rank=threads_per_rank,
        )

    def config_usage_lines(self, ranks: int, script_name: str | None) -> list[str]:
        return _export_text.config_usage_lines(ranks, script_name)
