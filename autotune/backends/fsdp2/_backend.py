"""FSDP2 as a :class:`~autotune.backends.TrainingBackend`: each member hands over to the
module of this package that does that job."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from autotune import events
from autotune.backends.fsdp2 import _config, _engine, _export_text, _memory
from autotune.errors import SpaceError

if TYPE_CHECKING:
    from autotune.candidate import Candidate
    from autotune.hardware import Hardware
    from autotune.script_config import ScriptConfig


# A script's probes train with the engine the script builds; the plan drops fsdp2 from a
# script study's space before a candidate could reach these.
NO_SCRIPT_PROBES = "FSDP2 probes of a script are not supported: drop fsdp2 from the space's backend"


class Fsdp2Backend:
    """torch's FSDP2 (``torch.distributed.fsdp.fully_shard``): no compiled ops, no NVMe."""

    name = "fsdp2"
    config_file_name = "fsdp2_config.json"

    render_config = staticmethod(_config.render_fsdp2_config)
    initialize_engine = staticmethod(_engine.initialize_engine)
    whole_parameters = staticmethod(_engine.whole_parameters)
    start_process_group = staticmethod(_engine.start_process_group)
    model_states = staticmethod(_memory.fsdp_model_states)
    transient_phases = staticmethod(_memory.fsdp_transient_phases)
    host_phases = staticmethod(_memory.fsdp_host_phases)
    validate_config = staticmethod(_config.validate_fsdp2_config)
    launch_script = staticmethod(_export_text.launch_script)
    config_usage_lines = staticmethod(_export_text.config_usage_lines)
    export_files = staticmethod(_export_text.export_files)
    code_lines = staticmethod(_export_text.code_lines)

    def ensure_ops(
        self,
        hardware: Hardware,
        offload_targets: Iterable[str] | None = None,
        emit: events.Emit = events.ignore,
    ) -> None:
        """FSDP2 is torch's own: nothing to build."""
        del hardware, offload_targets, emit

    def sharded_build(self, candidate: Candidate, config: dict[str, Any]) -> None:
        """The model is built whole and sharded by ``fully_shard`` in
        :meth:`initialize_engine`."""
        del candidate, config

    def prepare_rank_process(self) -> None:
        """Nothing: FSDP2 loads no ops."""

    def parameter_precision(self, candidate: Candidate) -> str:
        """FSDP2 keeps parameters in the dtype the model is built in, fp32, and computes in
        ``MixedPrecisionPolicy.param_dtype`` (the candidate's precision)."""
        del candidate
        return "fp32"

    def with_fallback_optimizer(self, config: dict[str, Any]) -> dict[str, Any]:
        return config  # torch's optimizers always build

    def uses_fallback_optimizer(self, config: dict[str, Any]) -> bool:
        del config
        return False

    def nvme_offload_problem(self, hardware: Hardware) -> str | None:
        del hardware
        return "FSDP2 offloads to CPU only (CPUOffloadPolicy)"

    def partial_offload_supported(self) -> bool:
        return False

    def config_for_script(self, config: dict[str, Any], script: ScriptConfig) -> dict[str, Any]:
        del config
        raise SpaceError(f"{script.path}: {NO_SCRIPT_PROBES}")

    def script_launch_script(self, **kwargs: Any) -> str:
        del kwargs
        raise SpaceError(NO_SCRIPT_PROBES)
