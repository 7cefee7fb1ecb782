"""A user's training script and its arguments: what autotune reads from them and what it
rewrites per candidate.

A script hands DeepSpeed its config as a file named on its command line (``--deepspeed
ds_config.json`` for the Hugging Face Trainer, ``--deepspeed_config ds_config.json`` for
scripts built on ``deepspeed.add_config_arguments``) or builds it in code. Per candidate,
autotune points that flag at the candidate's config and sets the script's own flags for
what the config alone cannot change in the script:

- the Hugging Face Trainer checks that the config's micro-batch and accumulation agree with
  ``--per_device_train_batch_size`` and ``--gradient_accumulation_steps``, and its precision
  with ``--bf16``/``--fp16``; it turns activation checkpointing on with
  ``--gradient_checkpointing``. These flags are known (``HF_TRAINER_FLAGS``);
- a plain DeepSpeed script reads its micro-batch back from the engine
  (``engine.train_micro_batch_size_per_gpu()``); if it has flags of its own for any of these,
  ``--script-arg DIMENSION=FLAG`` names them.

Nothing here imports torch: the CLI parses a script's arguments before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from autotune.errors import SettingsError

if TYPE_CHECKING:
    from autotune.candidate import Candidate

# What a script flag can carry, and whether it takes a value (False: a switch).
DIMENSIONS = {
    "micro_batch_size": True,
    "gradient_accumulation_steps": True,
    "activation_checkpointing": False,
    "checkpoint_fraction": True,
    "bf16": False,
    "fp16": False,
}
HF_TRAINER_FLAGS = {
    "micro_batch_size": "--per_device_train_batch_size",
    "gradient_accumulation_steps": "--gradient_accumulation_steps",
    "activation_checkpointing": "--gradient_checkpointing",
    "bf16": "--bf16",
    "fp16": "--fp16",
}
CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed")
# Flags of the deepspeed launcher and of torchrun: autotune launches the script itself.
LAUNCHER_FLAGS = (
    "--num_gpus", "--num_nodes", "--hostfile", "--include", "--exclude", "--master_port",
    "--master_addr", "--launcher", "--num_accelerators", "--bind_cores_to_rank",
    "--nproc-per-node", "--nproc_per_node", "--nnodes", "--node-rank", "--node_rank",
    "--rdzv-backend", "--rdzv-endpoint", "--standalone", "--local_rank", "--local-rank",
)  # fmt: skip
LAUNCHERS = ("deepspeed", "torchrun", "accelerate", "python", "python3")
_BOOL_WORDS = ("true", "false", "yes", "no", "1", "0", "t", "f", "y", "n")


class ScriptConfig(BaseModel):
    """A script as a study measures it: the file, the arguments it was given, and how the
    candidate's values reach it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="The script, an absolute path.")
    args: list[str] = Field(default_factory=list, description="Its arguments, as given.")
    kind: Literal["hf", "deepspeed"] = Field(
        description="'hf': a Hugging Face Trainer script (--deepspeed PATH and its flags); "
        "'deepspeed': a script that reads its batch from the engine."
    )
    flags: dict[str, str] = Field(
        default_factory=dict,
        description="Dimension -> the script's flag that carries it (micro_batch_size, "
        "gradient_accumulation_steps, activation_checkpointing, checkpoint_fraction, bf16, "
        "fp16).",
    )
    config_flag: str | None = Field(
        default=None, description="The flag naming its DeepSpeed config file, if any."
    )
    config_path: str | None = Field(
        default=None, description="The config file its arguments name (absolute)."
    )
    cwd: str = Field(description="The folder it runs in (relative paths in its arguments).")

    @property
    def name(self) -> str:
        return Path(self.path).name

    def argv(self, candidate: Candidate, config_path: str, *, cpu: bool = False) -> list[str]:
        """The script's arguments for ``candidate``, its config at ``config_path``; on CPU
        ranks a Trainer in bf16/fp16 also gets ``--use_cpu`` (it refuses them otherwise)."""
        args = list(self.args)
        if self.config_flag is not None:
            args = set_flag(args, self.config_flag, config_path)
        values: dict[str, str | bool] = {
            "micro_batch_size": str(candidate.micro_batch_size),
            "gradient_accumulation_steps": str(candidate.gradient_accumulation_steps),
            "activation_checkpointing": candidate.activation_checkpointing,
            "checkpoint_fraction": f"{candidate.checkpoint_fraction:g}",
            "bf16": candidate.precision == "bf16",
            "fp16": candidate.precision == "fp16",
        }
        for dimension, flag in self.flags.items():
            value = values[dimension]
            args = (
                set_switch(args, flag, value)
                if isinstance(value, bool)
                else set_flag(args, flag, value)
            )
        if cpu and self.kind == "hf" and candidate.precision != "fp32":
            args = set_switch(args, "--use_cpu", True)
        return args

    def changes(self, candidate: Candidate, config_path: str, *, cpu: bool = False) -> list[str]:
        """What ``argv`` changes in the script's arguments, one phrase each."""
        before = _by_flag(self.args)
        after = _by_flag(self.argv(candidate, config_path, cpu=cpu))
        lines = []
        for flag in dict.fromkeys([*before, *after]):
            old, new = before.get(flag), after.get(flag)
            if old == new:
                continue
            if old is None:
                lines.append(f"`{flag}{' ' + new if new else ''}` added")
            elif new is None:
                lines.append(f"`{flag}{' ' + old if old else ''}` removed")
            else:
                lines.append(f"`{flag}` {old or '(set)'} -> {new or '(set)'}")
        return lines


def _by_flag(args: list[str]) -> dict[str, str]:
    """``--flag value`` pairs (a switch maps to ''), for comparing argument lists."""
    found: dict[str, str] = {}
    for index, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        flag, sep, value = arg.partition("=")
        if not sep and index + 1 < len(args) and not args[index + 1].startswith("--"):
            value = args[index + 1]
        found[flag] = value
    return found


def _find(args: list[str], flag: str) -> list[int]:
    return [i for i, a in enumerate(args) if a == flag or a.startswith(flag + "=")]


def set_flag(args: list[str], flag: str, value: str) -> list[str]:
    """``args`` with ``flag value`` in place of every occurrence (appended if absent)."""
    positions = _find(args, flag)
    if not positions:
        return [*args, flag, value]
    out = list(args)
    for index in reversed(positions[1:]):
        del out[index : index + (1 if "=" in out[index] else 2)]
    first = positions[0]
    if "=" in out[first]:
        out[first] = f"{flag}={value}"
    elif first + 1 < len(out) and not out[first + 1].startswith("--"):
        out[first + 1] = value
    else:
        out.insert(first + 1, value)
    return out


def set_switch(args: list[str], flag: str, on: bool) -> list[str]:
    """``args`` with the switch ``flag`` present (once, bare) or absent; a value written
    after it (``--bf16 true``, ``--bf16=false``) goes with it."""
    positions = _find(args, flag)
    out = list(args)
    for index in reversed(positions):
        follows = index + 1 < len(out) and out[index + 1].lower() in _BOOL_WORDS
        del out[index : index + (2 if "=" not in out[index] and follows else 1)]
    if on:
        where = positions[0] if positions else len(out)
        out.insert(min(where, len(out)), flag)
    return out


def flag_value(args: list[str], flag: str) -> str | None:
    """The value of ``flag`` in ``args`` (the last occurrence), or None."""
    value = None
    for index in _find(args, flag):
        arg = args[index]
        if "=" in arg:
            value = arg.partition("=")[2]
        elif index + 1 < len(args) and not args[index + 1].startswith("--"):
            value = args[index + 1]
    return value


def parse_script(path: str, args: list[str], mappings: list[str], *, cwd: Path) -> ScriptConfig:
    """Read a script and its arguments; one error line for what autotune cannot run."""
    script = Path(path)
    if script.name in LAUNCHERS or script.stem in LAUNCHERS:
        raise SettingsError(
            f"--script {path}: give your training script, not a launcher; autotune launches it "
            "on --gpus N ranks itself (e.g. --script train.py -- --deepspeed ds_config.json)"
        )
    script = script if script.is_absolute() else cwd / script
    if not script.is_file():
        raise SettingsError(f"--script {path}: no such file; give the path of your training script")
    launcher = next(
        (a.partition("=")[0] for a in args if a.partition("=")[0] in LAUNCHER_FLAGS), None
    )
    if launcher is not None:
        raise SettingsError(
            f"{launcher} is a launcher flag, not one of {script.name}'s: autotune launches the "
            "script itself (torchrun, LOCAL_RANK in the environment); give the ranks with "
            f"--gpus N and drop {launcher} from the script's arguments"
        )
    config_flag = next((f for f in CONFIG_FLAGS if flag_value(args, f) is not None), None)
    config_path = flag_value(args, config_flag) if config_flag else None
    if config_path is not None:
        resolved = Path(config_path) if Path(config_path).is_absolute() else cwd / config_path
        if not resolved.is_file():
            raise SettingsError(
                f"{config_flag} {config_path}: no such file (an argument of {script.name}); "
                "give the DeepSpeed config your script trains with"
            )
        config_path = str(resolved.resolve())
    hf = config_flag == "--deepspeed" or "--per_device_train_batch_size" in _by_flag(args)
    flags = dict(HF_TRAINER_FLAGS) if hf else {}
    flags.update(parse_mappings(mappings))
    return ScriptConfig(
        path=str(script.resolve()),
        args=list(args),
        kind="hf" if hf else "deepspeed",
        flags={k: v for k, v in flags.items() if v},
        config_flag=config_flag,
        config_path=config_path,
        cwd=str(cwd.resolve()),
    )


def parse_mappings(mappings: list[str]) -> dict[str, str]:
    """``DIMENSION=FLAG`` entries of ``--script-arg`` (``DIMENSION=`` unmaps one)."""
    parsed: dict[str, str] = {}
    for entry in mappings:
        dimension, sep, flag = entry.partition("=")
        if not sep or dimension not in DIMENSIONS or (flag and not flag.startswith("-")):
            raise SettingsError(
                f"--script-arg {entry}: give DIMENSION=--flag with DIMENSION one of "
                f"{', '.join(DIMENSIONS)}, e.g. --script-arg micro_batch_size=--batch-size"
            )
        parsed[dimension] = flag
    return parsed
