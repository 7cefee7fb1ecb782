"""Search spaces: YAML files validated by pydantic, bound to a machine and a batch.

A :class:`SpaceSpec` is what the YAML says; :meth:`SpaceSpec.bind` keeps what this
hardware and global batch allow and returns a :class:`BoundSpace`, which suggests
candidates to Optuna define-by-run (conditional parameters, so an invalid combination is
never asked) and can enumerate every valid candidate. The validity rules live in
:func:`combination_problem`, the one place that knows them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator

from autotune.candidate import Candidate, OffloadDevice, Precision
from autotune.errors import SpaceError

if TYPE_CHECKING:
    import optuna

    from autotune.hardware import Hardware

SPACES_PACKAGE = "autotune.search_spaces"


class SpaceSpec(BaseModel):
    """The values each dimension may take; every list is tried in all valid combinations."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    precision: list[Precision] = Field(
        default=["fp32", "bf16", "fp16"],
        description="Precisions to try; those the hardware refuses are dropped with a note.",
    )
    zero_stage: list[Literal[0, 1, 2, 3]] = Field(
        default=[0, 1, 2, 3], description="ZeRO stages to try."
    )
    offload_optimizer: list[OffloadDevice] = Field(
        default=["none"], description="Optimizer-state offload targets (ZeRO 1-3)."
    )
    offload_param: list[OffloadDevice] = Field(
        default=["none"], description="Parameter offload targets (ZeRO 3 only)."
    )
    micro_batch_size: list[PositiveInt] = Field(
        description="Micro-batch sizes; those that do not divide the global batch are dropped."
    )
    activation_checkpointing: list[bool] = Field(
        default=[False], description="Activation checkpointing off and/or on."
    )

    @field_validator("*")
    @classmethod
    def _non_empty_unique(cls, values: list[Any]) -> list[Any]:
        if not values:
            raise ValueError("must list at least one value")
        if len(set(values)) != len(values):
            raise ValueError(f"lists a value twice: {values}")
        return values

    def bind(self, hardware: Hardware, *, data_parallel_size: int, global_batch: int) -> BoundSpace:
        """Keep what this machine and batch allow; raise SpaceError if nothing is left."""
        notes = []
        precisions = [p for p in self.precision if p in hardware.precisions]
        dropped = [p for p in self.precision if p not in hardware.precisions]
        if dropped:
            notes.append(
                f"{', '.join(dropped)} not supported on {hardware.accelerator} "
                f"({hardware.device_name}): dropped from the space"
            )
        if not precisions:
            raise SpaceError(
                f"space allows precision {self.precision} but this {hardware.accelerator} "
                f"supports only {list(hardware.precisions)}; add one of those to 'precision'"
            )
        if global_batch % data_parallel_size:
            raise SpaceError(
                f"--global-batch {global_batch} is not divisible by the {data_parallel_size} "
                "data-parallel ranks of a trial; pick a multiple of "
                f"{data_parallel_size}"
            )
        per_rank = global_batch // data_parallel_size
        micro_batches = sorted(m for m in self.micro_batch_size if per_rank % m == 0)
        if not micro_batches:
            raise SpaceError(
                f"no micro_batch_size in {self.micro_batch_size} divides the per-rank batch "
                f"{per_rank} (--global-batch {global_batch} / {data_parallel_size} ranks); "
                "add a divisor to micro_batch_size or change --global-batch"
            )
        skipped = sorted(set(self.micro_batch_size) - set(micro_batches))
        if skipped:
            notes.append(
                f"micro_batch_size {skipped} do not divide the per-rank batch {per_rank}: "
                "not candidates"
            )
        # A stage stays only if some listed offload pair is valid at it, so that define-by-run
        # suggestion (offload asked only where it can vary) never leaves the valid set.
        zero_stages = [
            stage
            for stage in self.zero_stage
            if any(
                combination_problem(stage, opt, param) is None
                for opt in self.offload_optimizer
                for param in self.offload_param
            )
        ]
        if not zero_stages:
            raise SpaceError(
                f"no zero_stage in {self.zero_stage} is valid with offload_optimizer "
                f"{self.offload_optimizer} and offload_param {self.offload_param}: "
                + "; ".join(
                    filter(
                        None,
                        {
                            combination_problem(s, o, p)
                            for s in self.zero_stage
                            for o in self.offload_optimizer
                            for p in self.offload_param
                        },
                    )
                )
            )
        return BoundSpace(
            spec=self,
            precisions=tuple(precisions),
            zero_stages=tuple(zero_stages),
            micro_batch_sizes=tuple(micro_batches),
            data_parallel_size=data_parallel_size,
            global_batch=global_batch,
            notes=tuple(notes),
        )


def combination_problem(zero_stage: int, offload_optimizer: str, offload_param: str) -> str | None:
    """Why a combination is invalid in DeepSpeed, or None when it is valid.

    DeepSpeed offloads optimizer states from ZeRO-1 on (ZeRO-Offload), and parameters only
    at ZeRO-3 (ZeRO-Infinity); see DeepSpeed's config-json docs, "zero_optimization".
    """
    if offload_optimizer != "none" and zero_stage < 1:
        return f"offload_optimizer {offload_optimizer!r} needs zero_stage 1, 2 or 3"
    if offload_param != "none" and zero_stage != 3:
        return f"offload_param {offload_param!r} needs zero_stage 3"
    return None


class BoundSpace(BaseModel):
    """A space bound to one machine and global batch: exactly the valid candidates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: SpaceSpec
    precisions: tuple[str, ...] = Field(description="Precisions the hardware supports.")
    zero_stages: tuple[int, ...] = Field(description="Stages with at least one valid candidate.")
    micro_batch_sizes: tuple[PositiveInt, ...] = Field(description="Divisors of per-rank batch.")
    data_parallel_size: PositiveInt = Field(description="Ranks of one probe.")
    global_batch: PositiveInt = Field(description="Samples per optimizer step.")
    notes: tuple[str, ...] = Field(default=(), description="What binding dropped, and why.")

    def _candidate(
        self,
        precision: str,
        zero_stage: int,
        offload_optimizer: str,
        offload_param: str,
        micro_batch_size: int,
        activation_checkpointing: bool,
    ) -> Candidate:
        return Candidate(
            precision=precision,
            zero_stage=zero_stage,
            offload_optimizer=offload_optimizer,
            offload_param=offload_param,
            micro_batch_size=micro_batch_size,
            gradient_accumulation_steps=self.global_batch
            // (micro_batch_size * self.data_parallel_size),
            data_parallel_size=self.data_parallel_size,
            activation_checkpointing=activation_checkpointing,
        )

    def candidates(self) -> Iterator[Candidate]:
        """Every valid candidate, in a stable order."""
        spec = self.spec
        for prec, stage, opt, param, mb, ckpt in itertools.product(
            self.precisions,
            self.zero_stages,
            spec.offload_optimizer,
            spec.offload_param,
            self.micro_batch_sizes,
            spec.activation_checkpointing,
        ):
            if combination_problem(stage, opt, param) is None:
                yield self._candidate(prec, stage, opt, param, mb, ckpt)

    def contains(self, candidate: Candidate) -> bool:
        return any(candidate == other for other in self.candidates())

    def suggest(self, trial: optuna.Trial) -> Candidate:
        """Define-by-run: a parameter is asked only where it can vary and is valid."""
        spec = self.spec
        precision = _choose(trial, "precision", self.precisions)
        zero_stage = _choose(trial, "zero_stage", self.zero_stages)
        offload_optimizer = "none"
        if zero_stage >= 1:
            offload_optimizer = _choose(trial, "offload_optimizer", spec.offload_optimizer)
        offload_param = "none"
        if zero_stage == 3:
            offload_param = _choose(trial, "offload_param", spec.offload_param)
        micro_batch_size = _choose(trial, "micro_batch_size", self.micro_batch_sizes)
        checkpointing = _choose(trial, "activation_checkpointing", spec.activation_checkpointing)
        return self._candidate(
            precision, zero_stage, offload_optimizer, offload_param, micro_batch_size, checkpointing
        )

    def params_of(self, candidate: Candidate) -> dict[str, Any]:
        """The Optuna parameters :meth:`suggest` would record for ``candidate``."""
        spec = self.spec
        params: dict[str, Any] = {}
        dims: list[tuple[str, Sequence[Any], bool]] = [
            ("precision", self.precisions, True),
            ("zero_stage", self.zero_stages, True),
            ("offload_optimizer", spec.offload_optimizer, candidate.zero_stage >= 1),
            ("offload_param", spec.offload_param, candidate.zero_stage == 3),
            ("micro_batch_size", self.micro_batch_sizes, True),
            ("activation_checkpointing", spec.activation_checkpointing, True),
        ]
        for name, choices, asked in dims:
            if asked and len(choices) > 1:
                params[name] = getattr(candidate, name)
        return params

    def size(self) -> int:
        return sum(1 for _ in self.candidates())


def _choose(trial: optuna.Trial, name: str, choices: Sequence[Any]) -> Any:
    # A dimension with one value is not a parameter: Optuna would record a constant.
    if len(choices) == 1:
        return choices[0]
    return trial.suggest_categorical(name, list(choices))


def builtin_space_names() -> list[str]:
    root = resources.files(SPACES_PACKAGE)
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def resolve_space_path(ref: str) -> tuple[str, str]:
    """A path or a built-in name -> (display name, YAML text)."""
    path = Path(ref)
    if path.is_file():
        return str(path), path.read_text(encoding="utf-8")
    root = resources.files(SPACES_PACKAGE)
    builtin = root / f"{ref}.yaml"
    if "/" not in ref and not ref.endswith((".yaml", ".yml")) and builtin.is_file():
        return f"search_spaces/{ref}.yaml", builtin.read_text(encoding="utf-8")
    raise SpaceError(
        f"--space {ref}: no such file, and no built-in space of that name; give a YAML path "
        f"or one of: {', '.join(builtin_space_names())}"
    )


def load_space(ref: str) -> SpaceSpec:
    """Load and validate a space; errors name the file, the key and what is allowed."""
    name, text = resolve_space_path(ref)
    return parse_space(text, source=name)


def parse_space(text: str, *, source: str = "<space>") -> SpaceSpec:
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpaceError(f"{where}: not valid YAML ({problem}); fix the syntax") from None
    if not isinstance(data, dict):
        raise SpaceError(
            f"{source}: a space is a mapping of dimension -> list of values, got "
            f"{type(data).__name__}; see search_spaces/default.yaml"
        )
    lines = _key_lines(node)
    try:
        return SpaceSpec.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = error["loc"]
        key = str(loc[0]) if loc else "?"
        where = f"{source}:{lines[key]}" if key in lines else source
        if error["type"] == "extra_forbidden":
            allowed = ", ".join(SpaceSpec.model_fields)
            raise SpaceError(f"{where}: unknown key {key!r}; allowed keys: {allowed}") from None
        field = SpaceSpec.model_fields.get(key)
        hint = f" ({field.description})" if field is not None and field.description else ""
        path = key + "".join(f"[{part}]" for part in loc[1:])
        raise SpaceError(
            f"{where}: {path}: {error['msg']}, got {error.get('input')!r}{hint}"
        ) from None


def _key_lines(node: yaml.Node | None) -> dict[str, int]:
    """Line number (1-based) of each top-level key, for error messages."""
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {
        str(key.value): key.start_mark.line + 1
        for key, _ in node.value
        if isinstance(key, yaml.ScalarNode)
    }
