"""The export of a study of the user's own script: ``launch.sh`` runs that script with the
arguments it was tuned with and the tuned config, and ``summary.md`` says which arguments
changed.

Every argument comes from the storage and reaches a shell script: each is quoted
(``shlex.quote``); only the exported config's path is left to the shell (``"$CONFIG"``).
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.candidate import Candidate
    from autotune.script_config import ScriptConfig
    from autotune.study import StudyConfig, TrialView

CONFIG_TOKEN = "\0autotune-config\0"  # stands for "$CONFIG" until the arguments are quoted


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else " " for ch in text)


def production_args(script: ScriptConfig, candidate: Candidate, cpu: bool) -> list[str]:
    """The script's arguments for the tuned candidate, the config's path a placeholder."""
    return script.argv(candidate, CONFIG_TOKEN, cpu=cpu)


def _shell_args(args: list[str]) -> str:
    """The arguments quoted for bash, a flag and its value on one line."""
    lines: list[list[str]] = []
    for arg in args:
        if CONFIG_TOKEN in arg:
            head, _, tail = arg.partition(CONFIG_TOKEN)
            text = (
                f'{shlex.quote(head) if head else ""}"$CONFIG"{shlex.quote(tail) if tail else ""}'
            )
        else:
            text = shlex.quote(arg)
        if arg.startswith("-") or not lines:
            lines.append([text])
        else:
            lines[-1].append(text)
    return "\n  ".join(" ".join(line) for line in lines)


def render_script_launch(study_name: str, trial: TrialView, config: StudyConfig) -> str:
    """``launch.sh`` for a script study."""
    script = config.script
    assert script is not None
    from autotune.backends import get_backend
    from autotune.export._numerics import production_env

    cpu = config.accelerator == "cpu"
    return get_backend(trial.candidate.backend).script_launch_script(
        origin=_printable(f"study {study_name!r}, trial {trial.number} ({trial.label})"),
        script_name=_printable(script.name),
        script_path=script.path,
        cwd=script.cwd,
        shell_args=_shell_args(production_args(script, trial.candidate, cpu)),
        passes_config=script.config_flag is not None,
        ranks=trial.candidate.data_parallel_size,  # the world size it was chosen for
        accelerator=config.accelerator,
        threads_per_rank=config.threads_per_rank,
        env=production_env(config),
    )


def script_summary_lines(trial: TrialView, config: StudyConfig) -> list[str]:
    """The "Your script" section of summary.md: how it was run and what changed."""
    script = config.script
    assert script is not None
    cpu = config.accelerator == "cpu"
    changes = script.changes(trial.candidate, "ds_config.json", cpu=cpu)
    kind = "a Hugging Face Trainer script" if script.kind == "hf" else "a DeepSpeed script"
    lines = [
        "## Your script",
        "",
        f"`{_printable(script.name)}` ({kind}) ran unedited as the probe, in "
        f"`{_printable(script.cwd)}`, with: `{_printable(shlex.join(script.args))}`.",
        "",
        "`launch.sh` runs it the same way; these arguments change:",
        "",
    ]
    lines += [f"- {_printable(change)}" for change in changes] or ["- none"]
    if script.config_flag is not None:
        lines.append(
            f"- `{script.config_flag}` names the exported `ds_config.json` (your config with "
            "the tuned keys laid over it; its other keys are yours, unchanged)."
        )
    else:
        lines.append(
            "- Your script builds its DeepSpeed config in code: copy the tuned keys of "
            "`ds_config.json` into it."
        )
    if script.kind == "hf":
        lines.append(
            "- `train_batch_size` is left out of `ds_config.json`: DeepSpeed derives it from "
            "the micro-batch and accumulation (the Trainer checks an explicit value against "
            "its own count of ranks)."
        )
    return lines


def without_autos(config: Any) -> Any:
    """``config`` without the Hugging Face Trainer's "auto" placeholders (for checking the
    rest with DeepSpeed's config class, which cannot read them)."""
    if isinstance(config, dict):
        return {k: without_autos(v) for k, v in config.items() if v != "auto"}
    return config
