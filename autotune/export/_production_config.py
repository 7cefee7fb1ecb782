"""The config a trial exports: its candidate rendered by its backend over the study's base
config, as production takes it (the user's NVMe path, the script's form of it, the
fallback optimizer where the probe stepped with it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.backends import get_backend

if TYPE_CHECKING:
    from autotune.study import StudyConfig, TrialView


def production_config(trial: TrialView, config: StudyConfig) -> dict[str, Any]:
    """The trial's candidate over the user's base config, with the user's NVMe path; with
    the backend's fallback optimizer where the probe stepped with it (for DeepSpeed, torch's
    Adam where FusedAdam did not build)."""
    largest = None
    if trial.candidate.offload_param == "nvme" and config.script is not None:
        from autotune.memory import read_probe

        model = read_probe(trial.record.trial_dir)[0]  # the script's model, as probed
        largest = model.largest_param if model is not None else None
    elif trial.candidate.offload_param == "nvme":  # its swap buffer must hold a partition
        from autotune.memory import model_facts
        from autotune.workloads import get_workload

        largest = model_facts(get_workload(config.workload), 0).largest_param
    backend = get_backend(trial.candidate.backend)
    rendered = backend.render_config(
        trial.candidate, config.base_config, nvme_path=config.nvme_path, largest_param_numel=largest
    )
    if config.script is not None:
        rendered = backend.config_for_script(rendered, config.script)
    if backend.uses_fallback_optimizer(trial.record.backend_config or {}):
        rendered = backend.with_fallback_optimizer(rendered)
    return rendered
