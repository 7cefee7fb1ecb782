"""Search spaces: YAML files validated by pydantic, bound to a machine and a batch.

A :class:`SpaceSpec` is what the YAML says; :meth:`SpaceSpec.bind` keeps what this
hardware, batch and NVMe path allow and returns a :class:`BoundSpace`. A bound space makes
its decisions in one place, :meth:`BoundSpace._decide` (define-by-run: a dimension is
decided only where it can vary and is valid), and that one procedure serves Optuna
(:meth:`suggest`), exhaustive enumeration (:meth:`candidates`) and the reverse mapping to
Optuna parameters (:meth:`params_of`), so the three can never disagree. The DeepSpeed
validity rules live in :func:`combination_problem` and ``ZERO_KNOB_STAGES``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator

from autotune.candidate import ZERO_KNOB_STAGES, Candidate, OffloadDevice, Precision, ZeroKnobs
from autotune.errors import SpaceError

if TYPE_CHECKING:
    import optuna

    from autotune.hardware import Hardware

SPACES_PACKAGE = "autotune.search_spaces"
Chooser = Callable[[str, Sequence[Any], str], Any]


def _non_empty_unique(values: list[Any] | None) -> list[Any] | None:
    if values is None:
        return None
    if not values:
        raise ValueError("must list at least one value")
    if len(set(values)) != len(values):
        raise ValueError(f"lists a value twice: {values}")
    return values


class ZeroKnobChoices(BaseModel):
    """Fine ZeRO knobs to search; an absent knob keeps DeepSpeed's (or the base's) value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    overlap_comm: list[bool] | None = Field(default=None, description="ZeRO 1-3.")
    contiguous_gradients: list[bool] | None = Field(default=None, description="ZeRO 1-3.")
    reduce_bucket_size: list[PositiveInt] | None = Field(
        default=None, description="Elements, ZeRO 1-3."
    )
    allgather_bucket_size: list[PositiveInt] | None = Field(
        default=None, description="Elements, ZeRO 1-2."
    )
    stage3_prefetch_bucket_size: list[PositiveInt] | None = Field(
        default=None, description="Elements, ZeRO 3."
    )
    stage3_param_persistence_threshold: list[PositiveInt] | None = Field(
        default=None, description="Elements, ZeRO 3."
    )
    stage3_max_live_parameters: list[PositiveInt] | None = Field(
        default=None, description="Elements, ZeRO 3."
    )
    sub_group_size: list[PositiveInt] | None = Field(default=None, description="Elements, ZeRO 3.")

    @field_validator("*", mode="after")
    @classmethod
    def _non_empty(cls, values: list[Any] | None) -> list[Any] | None:
        return _non_empty_unique(values)

    @field_validator("*", mode="before")
    @classmethod
    def _floats_to_ints(cls, values: Any) -> Any:
        # YAML reads 5.0e+8 as a float; bucket sizes are element counts.
        if isinstance(values, list):
            return [int(v) if isinstance(v, float) and v.is_integer() else v for v in values]
        return values

    def items(self) -> list[tuple[str, list[Any]]]:
        return [(k, v) for k, v in self.model_dump().items() if v is not None]


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
    offload_optimizer_ratio: list[float] = Field(
        default=[1.0],
        description="Share of optimizer states offloaded to CPU; < 1 is partial (ZeRO 3, cpu).",
    )
    offload_param: list[OffloadDevice] = Field(
        default=["none"], description="Parameter offload targets (ZeRO 3 only)."
    )
    micro_batch_size: list[PositiveInt] = Field(
        description="Micro-batch sizes; those that do not divide the global batch are dropped."
    )
    gradient_accumulation_steps: list[PositiveInt] = Field(
        default=[1, 2, 4, 8, 16, 32],
        description="Accumulation steps to try with --global-batch auto (else derived).",
    )
    activation_checkpointing: list[bool] = Field(
        default=[False], description="Activation checkpointing off and/or on."
    )
    zero_knobs: ZeroKnobChoices = Field(
        default_factory=ZeroKnobChoices,
        description="Fine ZeRO knobs to search (off by default).",
    )

    @field_validator(
        "precision",
        "zero_stage",
        "offload_optimizer",
        "offload_optimizer_ratio",
        "offload_param",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "activation_checkpointing",
    )
    @classmethod
    def _lists(cls, values: list[Any]) -> list[Any]:
        return _non_empty_unique(values) or []

    @field_validator("offload_optimizer_ratio")
    @classmethod
    def _ratios(cls, values: list[float]) -> list[float]:
        bad = [v for v in values if not 0 < v <= 1]
        if bad:
            raise ValueError(f"ratios must lie in (0, 1], got {bad}")
        return values

    def uses(self, device: str) -> bool:
        return device in self.offload_optimizer or device in self.offload_param

    def bind(
        self,
        hardware: Hardware,
        *,
        data_parallel_size: int,
        global_batch: int | None,
        max_global_batch: int | None = None,
        nvme_path: str | None = None,
        nvme_unavailable: str | None = None,
        partial_offload_supported: bool = True,
    ) -> BoundSpace:
        """Keep what this machine, batch and disk allow; raise SpaceError if nothing is left.

        ``global_batch=None`` is ``--global-batch auto``: accumulation becomes a dimension
        and micro x accumulation x ranks may be anything up to ``max_global_batch``.
        """
        notes: list[str] = []
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
        offload_optimizer, offload_param = list(self.offload_optimizer), list(self.offload_param)
        if self.uses("nvme"):
            reason = nvme_unavailable
            if not nvme_path:
                reason = "it needs --nvme-path DIR, a folder on an NVMe disk"
            if reason:
                for key, values in (
                    ("offload_optimizer", offload_optimizer),
                    ("offload_param", offload_param),
                ):
                    if values == ["nvme"]:
                        raise SpaceError(
                            f"space key {key} lists only 'nvme', but {reason}; pass "
                            "--nvme-path DIR (with libaio installed) or list other targets"
                        )
                notes.append(f"nvme offload dropped: {reason}")
                offload_optimizer = [d for d in offload_optimizer if d != "nvme"]
                offload_param = [d for d in offload_param if d != "nvme"]
        ratios = list(self.offload_optimizer_ratio)
        if not partial_offload_supported and any(r < 1 for r in ratios):
            notes.append(
                "offload_optimizer_ratio < 1 dropped: this DeepSpeed has no partial offload"
            )
            ratios = [1.0]
        if global_batch is not None and global_batch % data_parallel_size:
            raise SpaceError(
                f"--global-batch {global_batch} is not divisible by the {data_parallel_size} "
                f"data-parallel ranks of a trial; pick a multiple of {data_parallel_size}"
            )
        if global_batch is not None:
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
        else:
            if max_global_batch is None:
                raise SpaceError(
                    "--global-batch auto needs --max-global-batch N, the largest global batch "
                    "your training may use"
                )
            smallest_accumulation = min(self.gradient_accumulation_steps)
            micro_batches = sorted(
                m
                for m in self.micro_batch_size
                if m * smallest_accumulation * data_parallel_size <= max_global_batch
            )
            if not micro_batches:
                raise SpaceError(
                    f"--max-global-batch {max_global_batch} is below every micro_batch_size in "
                    f"{self.micro_batch_size} x {data_parallel_size} ranks; raise it"
                )
        # A stage stays only if some listed offload pair is valid at it, so that define-by-run
        # decisions (offload asked only where it can vary) never leave the valid set.
        zero_stages = [
            stage
            for stage in self.zero_stage
            if any(
                combination_problem(stage, opt, param) is None
                for opt in offload_optimizer
                for param in offload_param
            )
        ]
        if not zero_stages:
            problems = {
                combination_problem(s, o, p)
                for s in self.zero_stage
                for o in offload_optimizer
                for p in offload_param
            }
            raise SpaceError(
                f"no zero_stage in {self.zero_stage} is valid with offload_optimizer "
                f"{offload_optimizer} and offload_param {offload_param}: "
                + "; ".join(sorted(filter(None, problems)))
            )
        return BoundSpace(
            spec=self,
            precisions=tuple(precisions),
            zero_stages=tuple(zero_stages),
            offload_optimizer=tuple(offload_optimizer),
            offload_optimizer_ratios=tuple(sorted(ratios)),
            offload_param=tuple(offload_param),
            micro_batch_sizes=tuple(micro_batches),
            data_parallel_size=data_parallel_size,
            global_batch=global_batch,
            max_global_batch=max_global_batch,
            nvme_path=nvme_path,
            notes=tuple(notes),
        )


def combination_problem(zero_stage: int, offload_optimizer: str, offload_param: str) -> str | None:
    """Why a combination is invalid in DeepSpeed, or None when it is valid.

    DeepSpeed offloads optimizer states from ZeRO-1 on (ZeRO-Offload), and parameters only
    at ZeRO-3 (ZeRO-Infinity); see DeepSpeed's config-json docs, "zero_optimization".
    Partial offload (ratio < 1) is ZeRO-3 with CPU offload only (DeepSpeed asserts it in
    ``DeepSpeedZeroConfig.offload_ratio_check``); that rule is in ``BoundSpace._decide``.
    """
    if offload_optimizer != "none" and zero_stage < 1:
        return f"offload_optimizer {offload_optimizer!r} needs zero_stage 1, 2 or 3"
    if offload_param != "none" and zero_stage != 3:
        return f"offload_param {offload_param!r} needs zero_stage 3"
    return None


class BoundSpace(BaseModel):
    """A space bound to one machine and batch: exactly the valid candidates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: SpaceSpec
    precisions: tuple[str, ...] = Field(description="Precisions the hardware supports.")
    zero_stages: tuple[int, ...] = Field(description="Stages with at least one valid candidate.")
    offload_optimizer: tuple[str, ...] = Field(description="Optimizer offload targets kept.")
    offload_optimizer_ratios: tuple[float, ...] = Field(description="Partial offload ratios.")
    offload_param: tuple[str, ...] = Field(description="Parameter offload targets kept.")
    micro_batch_sizes: tuple[PositiveInt, ...] = Field(description="Micro-batches kept.")
    data_parallel_size: PositiveInt = Field(description="Ranks of one probe.")
    global_batch: PositiveInt | None = Field(description="Samples per step; None: auto.")
    max_global_batch: PositiveInt | None = Field(default=None, description="Cap in auto mode.")
    nvme_path: str | None = Field(default=None, description="Folder for NVMe offload.")
    notes: tuple[str, ...] = Field(default=(), description="What binding dropped, and why.")

    def _accumulations(self, micro_batch_size: int) -> list[int]:
        assert self.max_global_batch is not None
        limit = self.max_global_batch // (micro_batch_size * self.data_parallel_size)
        return [a for a in sorted(self.spec.gradient_accumulation_steps) if a <= limit]

    def _decide(self, choose: Chooser) -> Candidate:
        """Every decision, in define-by-run order; ``choose(name, choices, attribute)``."""
        precision = choose("precision", self.precisions, "precision")
        stage = choose("zero_stage", self.zero_stages, "zero_stage")
        offload_optimizer = "none"
        if stage >= 1:
            offload_optimizer = choose(
                "offload_optimizer", self.offload_optimizer, "offload_optimizer"
            )
        ratio = 1.0
        if stage == 3 and offload_optimizer == "cpu":
            ratio = choose(
                "offload_optimizer_ratio", self.offload_optimizer_ratios, "offload_optimizer_ratio"
            )
        offload_param = "none"
        if stage == 3:
            offload_param = choose("offload_param", self.offload_param, "offload_param")
        micro_batch = choose("micro_batch_size", self.micro_batch_sizes, "micro_batch_size")
        if self.global_batch is None:
            accumulation = choose(
                f"gradient_accumulation_steps_mb{micro_batch}",
                self._accumulations(micro_batch),
                "gradient_accumulation_steps",
            )
        else:
            accumulation = self.global_batch // (micro_batch * self.data_parallel_size)
        checkpointing = choose(
            "activation_checkpointing",
            self.spec.activation_checkpointing,
            "activation_checkpointing",
        )
        knobs = {
            name: choose(f"zero.{name}", choices, f"zero_knobs.{name}")
            for name, choices in self.spec.zero_knobs.items()
            if stage in ZERO_KNOB_STAGES[name]
        }
        return Candidate(
            precision=precision,
            zero_stage=stage,
            offload_optimizer=offload_optimizer,
            offload_optimizer_ratio=ratio,
            offload_param=offload_param,
            micro_batch_size=micro_batch,
            gradient_accumulation_steps=accumulation,
            data_parallel_size=self.data_parallel_size,
            activation_checkpointing=checkpointing,
            zero_knobs=ZeroKnobs(**knobs),
        )

    def suggest(self, trial: optuna.Trial) -> Candidate:
        """Ask Optuna for each decision that has more than one valid value."""

        def choose(name: str, choices: Sequence[Any], _: str) -> Any:
            # A dimension with one value is not a parameter: Optuna would record a constant.
            if len(choices) == 1:
                return choices[0]
            return trial.suggest_categorical(name, list(choices))

        return self._decide(choose)

    def candidates(self) -> Iterator[Candidate]:
        """Every valid candidate, in a stable order (an odometer over the decision tree)."""
        path: list[int] = []
        while True:
            sizes: list[int] = []

            def choose(
                _: str,
                choices: Sequence[Any],
                __: str,
                path: list[int] = path,
                sizes: list[int] = sizes,
            ) -> Any:
                index = path[len(sizes)] if len(sizes) < len(path) else 0
                sizes.append(len(choices))
                return choices[index]

            yield self._decide(choose)
            path = [path[i] if i < len(path) else 0 for i in range(len(sizes))]
            position = len(sizes) - 1
            while position >= 0 and path[position] + 1 >= sizes[position]:
                position -= 1
            if position < 0:
                return
            path = [*path[:position], path[position] + 1]

    def params_of(self, candidate: Candidate) -> dict[str, Any]:
        """The Optuna parameters :meth:`suggest` records for ``candidate``."""
        params: dict[str, Any] = {}

        def choose(name: str, choices: Sequence[Any], attribute: str) -> Any:
            value: Any = candidate
            for part in attribute.split("."):
                value = getattr(value, part)
            if len(choices) > 1:
                params[name] = value
            return value

        self._decide(choose)
        return params

    def contains(self, candidate: Candidate) -> bool:
        return any(candidate == other for other in self.candidates())

    def size(self) -> int:
        return sum(1 for _ in self.candidates())

    def dimensions(self) -> dict[str, dict[str, int]]:
        """For each dimension, how many valid candidates take each value."""
        counts: dict[str, dict[str, int]] = {}
        for candidate in self.candidates():
            values = candidate.model_dump(mode="json")
            knobs = values.pop("zero_knobs")
            values.update({f"zero.{k}": v for k, v in knobs.items() if v is not None})
            values.pop("data_parallel_size")
            for name, value in values.items():
                bucket = counts.setdefault(name, {})
                bucket[str(value)] = bucket.get(str(value), 0) + 1
        return counts


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
        loc = [str(part) for part in error["loc"]]
        key = loc[0] if loc else "?"
        line = lines.get(".".join(loc[:2])) or lines.get(key)
        where = f"{source}:{line}" if line else source
        if error["type"] == "extra_forbidden":
            model: type[BaseModel] = ZeroKnobChoices if len(loc) > 1 else SpaceSpec
            allowed = ", ".join(model.model_fields)
            name = loc[-1]
            raise SpaceError(f"{where}: unknown key {name!r}; allowed keys: {allowed}") from None
        field = SpaceSpec.model_fields.get(key)
        hint = f" ({field.description})" if field is not None and field.description else ""
        path = key + "".join(f"[{part}]" if part.isdigit() else f".{part}" for part in loc[1:])
        raise SpaceError(
            f"{where}: {path}: {error['msg']}, got {error.get('input')!r}{hint}"
        ) from None


def _key_lines(node: yaml.Node | None, prefix: str = "") -> dict[str, int]:
    """Line number (1-based) of each key (and of nested mapping keys), for error messages."""
    if not isinstance(node, yaml.MappingNode):
        return {}
    lines: dict[str, int] = {}
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode):
            name = f"{prefix}{key.value}"
            lines[name] = key.start_mark.line + 1
            lines.update(_key_lines(value, prefix=f"{name}."))
    return lines
