"""DeepSpeed as a :class:`~autotune.backends.TrainingBackend`: each member hands over to the
module of this package that does that job."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from autotune import events
from autotune.backends._torch_floor import torch_floor_problem
from autotune.backends.deepspeed import (
    _ds_config,
    _engine,
    _export_text,
    _model_states,
    _validate,
    _zero_phases,
)

if TYPE_CHECKING:
    from autotune.backends.deepspeed.ops import OpsReport
    from autotune.candidate import Candidate
    from autotune.hardware import Hardware


class DeepSpeedBackend:
    """DeepSpeed 0.19: ZeRO stages 0-3 with CPU and NVMe offload, its JIT ops."""

    name = "deepspeed"
    display_name = "DeepSpeed"
    cpu_ranks_library = "DeepSpeed's CPU accelerator"
    cpu_ranks_runtime = "DeepSpeed's CPU accelerator"
    engine_entry = "`deepspeed.initialize`"
    shards_by_block = False
    config_file_name = "ds_config.json"
    # pyproject.toml's floor too: a probe tells an OOM by torch.OutOfMemoryError, new in 2.5.
    torch_floor = (2, 5)

    # Members whose job one module of this package does with the same signature: that
    # module's function is the member.
    render_config = staticmethod(_ds_config.render_ds_config)
    sharded_build = staticmethod(_engine.sharded_build)
    start_process_group = staticmethod(_engine.start_process_group)
    initialize_engine = staticmethod(_engine.initialize_engine)
    whole_parameters = staticmethod(_engine.whole_parameters)
    model_states = staticmethod(_model_states.zero_model_states)
    transient_phases = staticmethod(_zero_phases.transient_phases)
    host_phases = staticmethod(_zero_phases.host_phases)
    validate_config = staticmethod(_validate.validate_ds_config)
    config_for_script = staticmethod(_ds_config.script_ds_config)
    launch_script = staticmethod(_export_text.launch_script)
    script_launch_script = staticmethod(_export_text.script_launch_script)
    config_usage_lines = staticmethod(_export_text.config_usage_lines)
    precision_actions = staticmethod(_export_text.precision_actions)

    def ensure_ops(
        self,
        hardware: Hardware,
        offload_targets: Iterable[str] | None = None,
        emit: events.Emit = events.ignore,
    ) -> OpsReport:
        from autotune.backends.deepspeed.ops import ensure_deepspeed_ops

        return ensure_deepspeed_ops(hardware, offload_targets=offload_targets, emit=emit)

    def parameter_precision(self, candidate: Candidate) -> str:
        """DeepSpeed holds the parameters in the candidate's precision after
        ``initialize`` (its fp32 master copy lives in the optimizer)."""
        return candidate.precision

    def export_files(
        self, config: dict[str, Any], ranks: int, accelerator: str, block_class: str
    ) -> dict[str, str]:
        """Nothing beside ``ds_config.json``."""
        del config, ranks, accelerator, block_class
        return {}

    def code_lines(self, config: dict[str, Any]) -> list[str]:
        """None: ``deepspeed.initialize(config=...)`` takes the config as it is."""
        del config
        return []

    def prepare_rank_process(self) -> None:
        from autotune.backends.deepspeed.ops import guard_op_loads

        guard_op_loads()  # a killed loader's leftover lock is cleared

    def with_fallback_optimizer(self, config: dict[str, Any]) -> dict[str, Any]:
        from autotune.backends.deepspeed.ops import use_torch_adam

        return use_torch_adam(config)

    def uses_fallback_optimizer(self, config: dict[str, Any]) -> bool:
        return bool(config.get("optimizer", {}).get("params", {}).get("torch_adam"))

    def unavailable(self, *, script: bool) -> str | None:
        """Only a torch below the floor: DeepSpeed probes scripts (``deepspeed.initialize``)."""
        del script
        return torch_floor_problem(self.torch_floor, "torch.OutOfMemoryError")

    def nvme_offload_problem(self, hardware: Hardware) -> str | None:
        from autotune.backends.deepspeed.ops import async_io_problem

        return async_io_problem(hardware)

    def partial_offload_supported(self) -> bool:
        from autotune.backends.deepspeed.ops import partial_offload_supported

        return partial_offload_supported()

    def calibration_group(self, candidate: Candidate) -> str:
        """Candidates of one ZeRO stage share a memory correction."""
        return f"z{candidate.zero_stage}"

    def holds_reduce_bucket(self, candidate: Candidate) -> bool:
        """ZeRO-3 keeps a reduce bucket of gradients beside the model states."""
        return candidate.zero_stage == 3

    def setup_actions(self, candidate: Candidate, base: dict[str, Any]) -> list[str]:
        """Nothing beyond the config: DeepSpeed reads everything from it."""
        del candidate, base
        return []
