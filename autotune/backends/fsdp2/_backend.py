"""FSDP2 as a :class:`~autotune.backends.TrainingBackend`: each member hands over to the
module of this package that does that job."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from autotune import events
from autotune.backends._torch_floor import torch_floor_problem
from autotune.backends.fsdp2 import _config, _engine, _export_text, _memory, _meta_init
from autotune.errors import SpaceError

if TYPE_CHECKING:
    from autotune.candidate import Candidate
    from autotune.hardware import Hardware
    from autotune.script_config import ScriptConfig


# A script's probes train with the engine the script builds; the plan drops fsdp2 from a
# script study's space (:meth:`Fsdp2Backend.unavailable`) before a candidate could reach these.
NO_SCRIPT_PROBES = "FSDP2 probes of a script are not supported: drop fsdp2 from the space's backend"
# Why every --script study drops FSDP2, whatever its script does.
SCRIPT_WITHOUT_FSDP2 = (
    "a --script study probes the DeepSpeed engine its script builds (deepspeed.initialize, "
    "or the Trainer's DeepSpeed config), and autotune hands no script FSDP2; to tune FSDP2, "
    "run the model as a Workload (--workload file.py:function)"
)
# What FSDP2's probes need of torch: fully_shard from torch.distributed.fsdp (public from
# 2.6) and reshard_after_forward=None for the root module (_engine.py; accepted from 2.8,
# PyTorch PR #155319: before it, _get_post_forward_mesh_info raises on None).
TORCH_FLOOR_NEEDS = "fully_shard with reshard_after_forward=None for the root module"


class Fsdp2Backend:
    """torch's FSDP2 (``torch.distributed.fsdp.fully_shard``): no compiled ops, no NVMe."""

    name = "fsdp2"
    display_name = "FSDP2"
    cpu_ranks_library = "torch's FSDP2"
    cpu_ranks_runtime = "gloo"
    engine_entry = "`fully_shard`"
    shards_by_block = True
    config_file_name = "fsdp2_config.json"
    torch_floor = (2, 8)  # TORCH_FLOOR_NEEDS

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
    precision_actions = staticmethod(_export_text.precision_actions)
    setup_actions = staticmethod(_export_text.setup_actions)

    def ensure_ops(
        self,
        hardware: Hardware,
        offload_targets: Iterable[str] | None = None,
        emit: events.Emit = events.ignore,
    ) -> None:
        """FSDP2 is torch's own: nothing to build."""
        del hardware, offload_targets, emit

    def sharded_build(
        self, candidate: Candidate, config: dict[str, Any]
    ) -> contextlib.AbstractContextManager[Any]:
        """The model is built with its parameters on the meta device (in fp32, its buffers
        as its code makes them); :meth:`initialize_engine` shards it with ``fully_shard``
        and gives each rank's shards memory, so that no rank holds the whole model."""
        del candidate, config
        return _meta_init.parameters_on_meta()

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

    def unavailable(self, *, script: bool) -> str | None:
        """A torch below the floor, or a ``script`` study (its probes are DeepSpeed's)."""
        problem = torch_floor_problem(self.torch_floor, TORCH_FLOOR_NEEDS)
        return problem or (SCRIPT_WITHOUT_FSDP2 if script else None)

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

    def calibration_group(self, candidate: Candidate) -> str:
        """Every FSDP2 candidate shards alike: one memory correction."""
        del candidate
        return "fsdp2"

    def holds_reduce_bucket(self, candidate: Candidate) -> bool:
        """FSDP2 reduces each unit's gradients as they are produced: no bucket is held."""
        del candidate
        return False
