"""Search spaces: YAML files validated by pydantic, bound to a machine and a batch.

A :class:`SpaceSpec` is what the YAML says; :meth:`SpaceSpec.bind` keeps what this
hardware, batch and NVMe path allow and returns a :class:`BoundSpace`. A bound space makes
its decisions in one place, :meth:`BoundSpace._decide` (define-by-run: a dimension is
decided only where it can vary and is valid), and that one procedure serves Optuna
(:meth:`suggest`), exhaustive enumeration (:meth:`candidates`) and the reverse mapping to
Optuna parameters (:meth:`params_of`), so the three can never disagree. The DeepSpeed
validity rules and the filters of binding live in :mod:`autotune.space._rules`
(``combination_problem``, re-exported here) and ``ZERO_KNOB_STAGES``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from autotune.candidate import (
    ZERO_KNOB_STAGES,
    ActivationOffload,
    BackendName,
    Candidate,
    CheckpointPolicy,
    OffloadDevice,
    Precision,
    ZeroKnobs,
)
from autotune.errors import SpaceError
from autotune.space._dropped_backend import DroppedBackend
from autotune.space._files import builtin_space_names as builtin_space_names  # re-exported
from autotune.space._fsdp_choices import FsdpChoices, bind_fsdp, decide_fsdp, decide_sync
from autotune.space._rules import (
    checkpoint_fractions_of,
    combination_problem,
    keep_backends,
    keep_micro_batches,
    keep_offload_targets,
    keep_precisions,
    keep_stages,
)
from autotune.space._zero_knob_choices import ZeroKnobChoices, non_empty_unique

if TYPE_CHECKING:
    import optuna

    from autotune.hardware import Hardware

Chooser = Callable[[str, Sequence[Any], str], Any]


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
        default=[False],
        description="Activation checkpointing off and/or on: every block recomputed or none "
        "(checkpoint_fraction 0 and 1).",
    )
    checkpoint_fraction: list[float] | None = Field(
        default=None,
        description="Shares of the model's blocks whose activations are recomputed in "
        "backward (0 none, 1 all), rounded to whole blocks; shares that round to the same "
        "count are one candidate. In place of activation_checkpointing.",
    )
    checkpoint_policy: list[CheckpointPolicy] | None = Field(
        default=None,
        description="How recomputed blocks recompute: every op again (full), or the matmul "
        "and attention outputs kept and the cheap ops recomputed (selective); asked only "
        "where some block is recomputed. Absent: full.",
    )
    activation_offload: list[ActivationOffload] | None = Field(
        default=None,
        description="Where the blocks that are not recomputed keep their saved activations: "
        "on the device (none), or in host memory through saved-tensor hooks (cpu); asked "
        "only where some block is not recomputed. Dropped on CPU ranks (host and device are "
        "one memory), for a script and for a workload without blocks. Absent: none.",
    )
    zero_knobs: ZeroKnobChoices = Field(
        default_factory=ZeroKnobChoices,
        description="Fine ZeRO knobs to search (off by default).",
    )
    backend: list[BackendName] = Field(
        default=["deepspeed"],
        description="Training libraries to try: deepspeed (ZeRO) and/or fsdp2 (torch's "
        "fully_shard).",
    )
    fsdp: FsdpChoices = Field(
        default_factory=FsdpChoices,
        description="fully_shard settings to search for backend fsdp2.",
    )

    @field_validator(
        "backend",
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
        return non_empty_unique(values) or []

    @field_validator("checkpoint_policy", "activation_offload")
    @classmethod
    def _optional_lists(cls, values: list[str] | None) -> list[str] | None:
        return None if values is None else non_empty_unique(values)

    @field_validator("checkpoint_fraction")
    @classmethod
    def _fractions(cls, values: list[float] | None) -> list[float] | None:
        if values is None:
            return None
        bad = [v for v in values if not 0 <= v <= 1]
        if bad:
            raise ValueError(f"fractions must lie in [0, 1], got {bad}")
        return non_empty_unique(values)

    @model_validator(mode="after")
    def _one_checkpointing_spelling(self) -> SpaceSpec:
        if self.checkpoint_fraction is not None and "activation_checkpointing" in (
            self.model_fields_set
        ):
            raise ValueError(
                "give checkpoint_fraction or activation_checkpointing, not both "
                "(activation_checkpointing [false, true] is checkpoint_fraction [0, 1])"
            )
        return self

    @property
    def checkpointing_fractions(self) -> list[float]:
        """The shares of blocks recomputed this space lists, in either spelling."""
        if self.checkpoint_fraction is not None:
            return list(self.checkpoint_fraction)
        return [1.0 if on else 0.0 for on in self.activation_checkpointing]

    def with_checkpointing(
        self, fractions: Sequence[float], policies: Sequence[str] | None = None
    ) -> SpaceSpec:
        """This space recomputing ``fractions`` of the blocks instead (all or none of them
        spelt as activation_checkpointing, as a space that never listed a fraction), by
        ``policies`` (None: the space's own)."""
        if all(f in (0, 1) for f in fractions) and self.checkpoint_fraction is None:
            update: dict[str, Any] = {"activation_checkpointing": [f == 1 for f in fractions]}
        else:
            update = {"checkpoint_fraction": list(fractions)}
        if policies is not None:
            update["checkpoint_policy"] = list(policies)
        return self.model_copy(update=update)

    @field_validator("offload_optimizer_ratio")
    @classmethod
    def _ratios(cls, values: list[float]) -> list[float]:
        bad = [v for v in values if not 0 < v <= 1]
        if bad:
            raise ValueError(f"ratios must lie in (0, 1], got {bad}")
        return values

    def stored(self) -> dict[str, Any]:
        """The space as a study stores it (and compares a continued run's against): a
        space that trains with DeepSpeed only leaves out the FSDP2 keys, as studies stored
        before there was a second backend did, so that those continue."""
        values = self.model_dump(mode="json")
        if self.backend == ["deepspeed"]:
            del values["backend"], values["fsdp"]
        for name in ("checkpoint_fraction", "checkpoint_policy", "activation_offload"):
            if values[name] is None:
                del values[name]
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
        world_sizes: tuple[int, ...] = (),
        unavailable_backends: Mapping[str, str] | None = None,
        checkpoint_blocks: int | None = None,
    ) -> BoundSpace:
        """Keep what this machine, batch and disk allow; raise SpaceError if nothing is left.

        ``global_batch=None`` is ``--global-batch auto``: accumulation becomes a dimension
        and micro x accumulation x ranks may be anything up to ``max_global_batch``.
        ``world_sizes`` (``--gpus 1-8``): the ranks of a probe become a dimension, each
        size with the micro-batches its share of the global batch allows; a size that
        allows none is dropped with a note. ``unavailable_backends``: a backend's name to
        why this study cannot train with it; a listed one is dropped with that reason (the
        bound space's ``dropped_backends``). ``checkpoint_blocks``: the blocks the
        workload recomputes one at a time, which a ``checkpoint_fraction`` counts its share
        of (needed where the space lists one).
        """
        notes: list[str] = []
        precisions = keep_precisions(list(self.precision), hardware, notes)
        offload_optimizer, offload_param = keep_offload_targets(
            list(self.offload_optimizer),
            list(self.offload_param),
            list(self.zero_stage),
            nvme_path,
            nvme_unavailable,
            notes,
        )
        ratios = self._bind_ratios(partial_offload_supported, notes)
        by_world = self._micro_batches_by_world(
            world_sizes or (data_parallel_size,), global_batch, max_global_batch, notes
        )
        micro_batches = sorted({m for sizes in by_world.values() for m in sizes})
        zero_stages = keep_stages(list(self.zero_stage), offload_optimizer, offload_param)
        return BoundSpace(
            spec=self,
            **self._bind_backends(unavailable_backends or {}, precisions, tuple(by_world), notes),
            precisions=tuple(precisions),
            zero_stages=tuple(zero_stages),
            offload_optimizer=tuple(offload_optimizer),
            offload_optimizer_ratios=tuple(sorted(ratios)),
            offload_param=tuple(offload_param),
            micro_batch_sizes=tuple(micro_batches),
            data_parallel_size=max(by_world) if world_sizes else data_parallel_size,
            micro_batch_sizes_by_world=by_world if world_sizes else {},
            global_batch=global_batch,
            max_global_batch=max_global_batch,
            nvme_path=nvme_path,
            checkpoint_fractions=self._bind_fractions(checkpoint_blocks, notes),
            notes=tuple(notes),
        )

    def _bind_ratios(self, partial_offload_supported: bool, notes: list[str]) -> list[float]:
        ratios = list(self.offload_optimizer_ratio)
        if not partial_offload_supported and any(r < 1 for r in ratios):
            notes.append(
                "offload_optimizer_ratio < 1 dropped: this DeepSpeed has no partial offload"
            )
            ratios = [1.0]
        return ratios

    def _bind_fractions(self, blocks: int | None, notes: list[str]) -> tuple[float, ...]:
        """The listed checkpoint fractions as whole blocks (k / ``blocks``), or as listed
        where ``blocks`` is None (a script, which counts its own); empty where the space
        lists none (it searches ``activation_checkpointing``)."""
        if self.checkpoint_fraction is None:
            return ()
        if blocks is None:
            return tuple(sorted(self.checkpoint_fraction))
        return checkpoint_fractions_of(self.checkpoint_fraction, blocks, notes)

    def _bind_backends(
        self,
        unavailable: Mapping[str, str],
        precisions: list[str],
        sizes: tuple[int, ...],
        notes: list[str],
    ) -> dict[str, Any]:
        """The bound space's backends, those dropped, and FSDP2's choices (FSDP2's only
        where it is kept)."""
        backends, dropped = keep_backends(list(self.backend), unavailable, notes)
        fsdp, fsdp_precisions = self.fsdp, tuple(precisions)
        if "fsdp2" in backends:
            fsdp, fsdp_precisions = bind_fsdp(self.fsdp, precisions, sizes, notes)
        return {
            "backends": tuple(backends),
            "dropped_backends": tuple(dropped),
            "fsdp": fsdp,
            "fsdp_precisions": fsdp_precisions,
        }

    def _micro_batches_by_world(
        self,
        sizes: tuple[int, ...],
        global_batch: int | None,
        max_global_batch: int | None,
        notes: list[str],
    ) -> dict[int, tuple[int, ...]]:
        """The micro-batches each world size allows (a single size: its error is the
        space's; one of several: dropped with a note)."""
        by_world: dict[int, tuple[int, ...]] = {}
        for size in sizes:
            found: list[str] = []
            try:
                kept = keep_micro_batches(
                    list(self.micro_batch_size),
                    list(self.gradient_accumulation_steps),
                    data_parallel_size=size,
                    global_batch=global_batch,
                    max_global_batch=max_global_batch,
                    notes=found,
                )
            except SpaceError as exc:
                if len(sizes) == 1:
                    raise
                notes.append(f"{size} rank(s) dropped from the world sizes: {exc}")
                continue
            by_world[size] = tuple(kept)
            notes += [f"{n} (at {size} ranks)" if len(sizes) > 1 else n for n in found]
        if not by_world:
            raise SpaceError(
                f"no world size of {', '.join(map(str, sizes))} takes a micro_batch_size of "
                f"{list(self.micro_batch_size)}; change --global-batch or the space"
            )
        return by_world


class BoundSpace(BaseModel):
    """A space bound to one machine and batch: exactly the valid candidates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: SpaceSpec
    backends: tuple[str, ...] = Field(
        default=("deepspeed",), description="Training libraries kept."
    )
    dropped_backends: tuple[DroppedBackend, ...] = Field(
        default=(), description="Listed training libraries this study cannot use here, and why."
    )
    fsdp: FsdpChoices = Field(
        default_factory=FsdpChoices, description="fully_shard settings kept (fsdp2)."
    )
    fsdp_precisions: tuple[str, ...] = Field(
        default=(), description="Precisions an fsdp2 candidate may take."
    )
    precisions: tuple[str, ...] = Field(description="Precisions the hardware supports.")
    zero_stages: tuple[int, ...] = Field(description="Stages with at least one valid candidate.")
    offload_optimizer: tuple[str, ...] = Field(description="Optimizer offload targets kept.")
    offload_optimizer_ratios: tuple[float, ...] = Field(description="Partial offload ratios.")
    offload_param: tuple[str, ...] = Field(description="Parameter offload targets kept.")
    micro_batch_sizes: tuple[PositiveInt, ...] = Field(description="Micro-batches kept.")
    data_parallel_size: PositiveInt = Field(
        description="Ranks of one probe (the largest world size where they are searched)."
    )
    micro_batch_sizes_by_world: dict[int, tuple[PositiveInt, ...]] = Field(
        default_factory=dict,
        description="Searched world sizes (--gpus 1-8) and the micro-batches each allows; "
        "empty: one world size, data_parallel_size.",
    )
    global_batch: PositiveInt | None = Field(description="Samples per step; None: auto.")
    max_global_batch: PositiveInt | None = Field(default=None, description="Cap in auto mode.")
    nvme_path: str | None = Field(default=None, description="Folder for NVMe offload.")
    checkpoint_fractions: tuple[float, ...] = Field(
        default=(),
        description="Shares of blocks recomputed, each a whole number of blocks; empty: "
        "the space's activation_checkpointing switch.",
    )
    notes: tuple[str, ...] = Field(default=(), description="What binding dropped, and why.")

    @property
    def world_sizes(self) -> tuple[int, ...]:
        """The world sizes a candidate may take: the searched ones, else the one."""
        return tuple(self.micro_batch_sizes_by_world) or (self.data_parallel_size,)

    def _micro_batches_at(self, ranks: int) -> tuple[int, ...]:
        return self.micro_batch_sizes_by_world.get(ranks, self.micro_batch_sizes)

    def _accumulations(self, micro_batch_size: int, ranks: int) -> list[int]:
        assert self.max_global_batch is not None
        limit = self.max_global_batch // (micro_batch_size * ranks)
        return [a for a in sorted(self.spec.gradient_accumulation_steps) if a <= limit]

    def _optimizer_targets(self, stage: int) -> tuple[str, ...]:
        """The optimizer offload targets valid at ``stage`` with some listed parameter target
        (binding keeps only stages where at least one is)."""
        return tuple(
            device
            for device in self.offload_optimizer
            if any(
                combination_problem(stage, device, param) is None
                for param in (self.offload_param if stage == 3 else ("none",))
            )
        )

    def _decide_split(self, choose: Chooser) -> tuple[int, int, int]:
        """The world size, micro-batch and accumulation. Optuna wants one fixed set of
        choices per name: a world size whose share of the batch allows other micro-batches
        asks under its own name."""
        ranks = choose("data_parallel_size", self.world_sizes, "data_parallel_size")
        micro_choices = self._micro_batches_at(ranks)
        name = "micro_batch_size"
        if micro_choices != self.micro_batch_sizes:
            name = f"micro_batch_size_dp{ranks}"
        micro_batch = choose(name, micro_choices, "micro_batch_size")
        if self.global_batch is not None:
            return ranks, micro_batch, self.global_batch // (micro_batch * ranks)
        suffix = f"_dp{ranks}" if len(self.world_sizes) > 1 else ""
        accumulation = choose(
            f"gradient_accumulation_steps_mb{micro_batch}{suffix}",
            self._accumulations(micro_batch, ranks),
            "gradient_accumulation_steps",
        )
        return ranks, micro_batch, accumulation

    def _decide(self, choose: Chooser) -> Candidate:
        """Every decision, in define-by-run order; ``choose(name, choices, attribute)``."""
        if choose("backend", self.backends, "backend") == "fsdp2":
            return self._decide_fsdp2(choose)
        precision = choose("precision", self.precisions, "precision")
        stage = choose("zero_stage", self.zero_stages, "zero_stage")
        offload_optimizer = "none"
        if stage >= 1:
            targets = self._optimizer_targets(stage)
            # Optuna wants one fixed set of choices per parameter name: a stage where fewer
            # targets are valid (no nvme below ZeRO-3) asks under its own name.
            name = "offload_optimizer"
            if targets != self.offload_optimizer:
                name = "offload_optimizer_z12"
            offload_optimizer = choose(name, targets, "offload_optimizer")
        ratio = 1.0
        if stage == 3 and offload_optimizer == "cpu":
            ratio = choose(
                "offload_optimizer_ratio", self.offload_optimizer_ratios, "offload_optimizer_ratio"
            )
        offload_param = "none"
        if stage == 3:
            offload_param = choose("offload_param", self.offload_param, "offload_param")
        ranks, micro_batch, accumulation = self._decide_split(choose)
        checkpointing = self._decide_checkpointing(choose)
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
            data_parallel_size=ranks,
            zero_knobs=ZeroKnobs(**knobs),
            **checkpointing,
        )

    def _decide_fsdp2(self, choose: Chooser) -> Candidate:
        """An fsdp2 candidate's decisions: its precision (under its own name where FSDP2
        takes fewer than DeepSpeed), the ``fully_shard`` settings, the split and
        activation checkpointing."""
        name = "precision" if self.fsdp_precisions == self.precisions else "precision_fsdp2"
        precision = choose(name, self.fsdp_precisions, "precision")
        cpu_offload, knobs = decide_fsdp(choose, self.fsdp)
        ranks, micro_batch, accumulation = self._decide_split(choose)
        knobs = decide_sync(choose, self.fsdp, knobs, accumulation)
        checkpointing = self._decide_checkpointing(choose)
        offload = "cpu" if cpu_offload else "none"
        return Candidate(
            backend="fsdp2",
            precision=precision,
            zero_stage=3,
            offload_optimizer=offload,
            offload_param=offload,
            micro_batch_size=micro_batch,
            gradient_accumulation_steps=accumulation,
            data_parallel_size=ranks,
            fsdp=knobs,
            **checkpointing,
        )

    def _decide_checkpointing(self, choose: Chooser) -> dict[str, Any]:
        """The share of blocks recomputed (a fraction where the space lists them, else the
        all-or-nothing switch, as studies stored before the fraction ask it), where some
        block is, how, and where some block is not, where its saved activations live: the
        candidate's activation fields."""
        if self.checkpoint_fractions:
            fraction = float(
                choose("checkpoint_fraction", self.checkpoint_fractions, "checkpoint_fraction")
            )
        else:
            on = choose(
                "activation_checkpointing",
                self.spec.activation_checkpointing,
                "activation_checkpointing",
            )
            fraction = 1.0 if on else 0.0
        decided: dict[str, Any] = {"checkpoint_fraction": fraction}
        if fraction > 0 and self.spec.checkpoint_policy:
            decided["checkpoint_policy"] = choose(
                "checkpoint_policy", tuple(self.spec.checkpoint_policy), "checkpoint_policy"
            )
        if fraction < 1 and self.spec.activation_offload:
            decided["activation_offload"] = choose(
                "activation_offload", tuple(self.spec.activation_offload), "activation_offload"
            )
        return decided

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

    def size(self) -> int:
        return sum(1 for _ in self.candidates())

    def _spell_checkpointing(self, candidate: Candidate, values: dict[str, Any]) -> None:
        """A candidate's recomputation as the space spells it (its record stores a share of
        0 or 1 as the switch, and a full policy or no offload not at all): every share
        listed, the policy where some block is recomputed, the offload where some is kept."""
        if self.checkpoint_fractions:
            values.pop("activation_checkpointing", None)
            values["checkpoint_fraction"] = f"{candidate.checkpoint_fraction:g}"
        values.pop("checkpoint_policy", None)
        if self.spec.checkpoint_policy and candidate.activation_checkpointing:
            values["checkpoint_policy"] = candidate.checkpoint_policy
        values.pop("activation_offload", None)
        if self.spec.activation_offload and candidate.checkpoint_fraction < 1:
            values["activation_offload"] = candidate.activation_offload

    def dimensions(self) -> dict[str, dict[str, int]]:
        """For each dimension, how many valid candidates take each value."""
        counts: dict[str, dict[str, int]] = {}
        for candidate in self.candidates():
            values = candidate.dimension_values()
            if len(self.backends) == 1:
                values.pop("backend")
            if len(self.world_sizes) == 1:
                values.pop("data_parallel_size")
            self._spell_checkpointing(candidate, values)
            for name, value in values.items():
                bucket = counts.setdefault(name, {})
                bucket[str(value)] = bucket.get(str(value), 0) + 1
        return counts
