"""The DeepSpeed-specific text of the export: ``launch.sh`` (the deepspeed launcher and
torchrun command lines that hand the script ``ds_config.json``) and the summary's lines on
how to use the config.

Every value that comes from the storage arrives here quoted or made printable by the caller,
except the numbers, which are quoted here.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.backends._shell_text import export_lines

if TYPE_CHECKING:
    from autotune.candidate import Candidate


def _exports(accelerator: str, env: Mapping[str, str]) -> str:
    """``export`` lines: the CPU accelerator for DeepSpeed on CPU ranks, keeping a value the
    caller's environment already has, then ``env`` (what production must set to compute as
    the probes did), set whatever the caller's environment holds."""
    wanted = {"DS_ACCELERATOR": "cpu"} if accelerator == "cpu" else {}
    return export_lines(wanted) + export_lines(env, keep_callers=False)


def launch_script(
    origin: str,
    ranks: int,
    accelerator: str,
    threads_per_rank: int,
    env: Mapping[str, str] | None = None,
    config: dict[str, Any] | None = None,
) -> str:
    """``launch.sh`` that starts the user's script (its first argument) with the config
    (``config``: the exported one, which the script reads from ``ds_config.json``)."""
    del config
    device = "GPU(s)" if accelerator == "cuda" else "CPU rank(s)"
    return f"""#!/usr/bin/env bash
# autotune export: {origin},
# tuned for {ranks} {device} on one node.
#
#   ./launch.sh train.py [your script's arguments]                     # deepspeed launcher
#   LAUNCHER=torchrun ./launch.sh train.py [your script's arguments]   # torchrun
#
# The deepspeed launcher's rendezvous port is MASTER_PORT (29500 unless set: give another
# where a second job on the node holds it); torchrun --standalone picks a free one.
# Your script hands the config to deepspeed.initialize(config=...); this script passes
# its path as --deepspeed_config (change the flag below if your script reads another one).
set -euo pipefail
CONFIG="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)/ds_config.json"
SCRIPT="${{1:?usage: $0 train.py [arguments of your script]}}"
shift
# The probes ran with this many intra-op threads per rank.
export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{shlex.quote(str(threads_per_rank))}}}"
{_exports(accelerator, env or {})}case "${{LAUNCHER:-deepspeed}}" in
  deepspeed)
    exec deepspeed --num_gpus={ranks} --master_port "${{MASTER_PORT:-29500}}" \\
      "$SCRIPT" --deepspeed_config "$CONFIG" "$@" ;;
  torchrun)
    exec torchrun --standalone --nproc-per-node={ranks} \\
      "$SCRIPT" --deepspeed_config "$CONFIG" "$@" ;;
  *) echo "LAUNCHER must be deepspeed or torchrun, got ${{LAUNCHER}}" >&2; exit 2 ;;
esac
"""


def script_launch_script(
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
    env: Mapping[str, str] | None = None,
) -> str:
    """``launch.sh`` that runs the user's own script with ``shell_args`` (already quoted for
    bash; ``"$CONFIG"`` names the exported config); ``passes_config`` is False where the
    script takes no config path."""
    device = "CPU rank(s)" if accelerator == "cpu" else "GPU(s)"
    no_config = (
        "# Your script builds its DeepSpeed config in code: put ds_config.json's values there\n"
        "# (or have it read a --deepspeed_config path) -- this launch cannot hand it over.\n"
        if not passes_config
        else ""
    )
    return f"""#!/usr/bin/env bash
# autotune export: {origin},
# tuned for {ranks} {device} on one node.
#
# Runs {script_name} with the arguments it was tuned with, the tuned ds_config.json
# beside this file, and the flags the tuned values need (summary.md lists what changed):
#   ./launch.sh                         # torchrun, as the probes ran it
#   LAUNCHER=deepspeed ./launch.sh      # the deepspeed launcher (it adds --local_rank)
#   ./launch.sh --more args             # appended to the script's arguments
{no_config}set -euo pipefail
CONFIG="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)/ds_config.json"
cd {shlex.quote(cwd)}
# The probes ran with this many intra-op threads per rank.
export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{shlex.quote(str(threads_per_rank))}}}"
{_exports(accelerator, env or {})}ARGS=(
  {shell_args}
)
case "${{LAUNCHER:-torchrun}}" in
  torchrun)
    exec torchrun --standalone --nproc-per-node={ranks} {shlex.quote(script_path)} \\
      "${{ARGS[@]}}" "$@" ;;
  deepspeed)
    exec deepspeed --num_gpus={ranks} {shlex.quote(script_path)} "${{ARGS[@]}}" "$@" ;;
  *) echo "LAUNCHER must be torchrun or deepspeed, got ${{LAUNCHER}}" >&2; exit 2 ;;
esac
"""


def config_usage_lines(ranks: int, script_name: str | None) -> list[str]:
    """The summary's "Files" lines: how to use the config and ``launch.sh``; ``script_name``
    (printable) where the study tuned the user's own script."""
    if script_name is not None:
        return [
            "- `ds_config.json`: your script's config with the tuned keys; `launch.sh` hands "
            "it to the script.",
            f"- `launch.sh`: runs `{script_name}` as it was tuned (torchrun, "
            f"or `LAUNCHER=deepspeed`) on {ranks} rank(s).",
        ]
    return [
        "- `ds_config.json`: pass it to `deepspeed.initialize(config=...)` unchanged.",
        "- `launch.sh`: starts your script with the deepspeed launcher or torchrun "
        f"(`LAUNCHER=torchrun`) on {ranks} rank(s).",
    ]


def precision_actions(candidate: Candidate) -> list[str]:
    """What the user's code must do about the candidate's precision: DeepSpeed scales fp16
    losses and casts to bf16 itself."""
    if candidate.precision == "fp16":
        return [
            "fp16 uses DeepSpeed's dynamic loss scaling (ds_config.json); do not add your own "
            "GradScaler."
        ]
    if candidate.precision == "bf16":
        return ["DeepSpeed casts the model to bf16; do not call `model.half()` yourself."]
    return []
