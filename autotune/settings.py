"""Run settings (pydantic), each declared once with its flag, unit, default and help.

The models are strict (``extra="forbid"``) and frozen; every field says what it means and
carries its unit in its name. The units' parsers live in :mod:`autotune.units`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError

from autotune.errors import SettingsError
from autotune.flag import Flag, problem_line
from autotune.script_config import ScriptConfig
from autotune.training_goal import TrainingGoal
from autotune.units import (
    DURATION,
    GLOBAL_BATCH,
    PATH,
    SIZE_OR_AUTO,
    WORLD_SIZES,
    format_duration,
)

# What --tf32 means for a training process's environment. ATen reads the variable once per
# process (Context::allowTF32CuBLAS): "1" makes cuBLAS use TF32 for fp32 matmuls whatever
# float32_matmul_precision says; NGC's PyTorch containers export it.
TF32_CUBLAS_OVERRIDE_ENV = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"


def tf32_cublas_override(precision: str) -> str:
    """The value of :data:`TF32_CUBLAS_OVERRIDE_ENV` for a process whose fp32 matmuls follow
    ``precision`` (torch's float32_matmul_precision): "0" for "highest" (IEEE fp32; an
    inherited "1" would force TF32), else "1" (TF32, whatever the training script sets)."""
    return "0" if precision == "highest" else "1"


_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@\s]*@")


def mask_url(url: str) -> str:
    """A storage URL as it may be printed: a password in it replaced by ``***``."""
    return _URL_PASSWORD.sub(r"\1***@", url)


Executor = Literal["ray", "local"]

DEFAULT_BUDGET_S = 30 * 60.0  # what a new study gets without --budget
DEFAULT_STORAGE = "sqlite:///trials/autotune.db"
# Optimizer steps of each loss run of `autotune verify`: bf16's tolerance is still
# under 10% at the tenth (autotune.study.loss_comparison), and 10 steps of a tiny model take
# seconds on CPU ranks.
DEFAULT_VERIFY_STEPS = 10

MAX_BUDGET_S = 30 * 24 * 3600  # a month: past it, a typo (99999h), not a plan


class LimitSettings(BaseModel):
    """The limits a study searches within: the devices, their memory, the host's memory, the
    NVMe folder offload may use, and the batch they train."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nvme_path: Annotated[Path | None, Flag(unit=PATH, names_file=True)] = Field(
        default=None, description="Folder on an NVMe disk, for nvme offload candidates."
    )
    world_sizes: Annotated[
        tuple[PositiveInt, ...], Flag("gpus", WORLD_SIZES, shown_default="1")
    ] = Field(
        default=(1,),
        min_length=1,
        description="Devices the study may use (CPU ranks without GPUs), every probe's world "
        "size; a range (1-8) or a list (2,4,8) makes the world size a searched dimension, each "
        "at the same global batch.",
    )
    gpus_per_trial: Annotated[PositiveInt | None, Flag()] = Field(
        default=None, description="Devices one probe uses (default: all of --gpus)."
    )
    vram_limit_bytes: Annotated[
        PositiveInt | None, Flag("vram", SIZE_OR_AUTO, shown_default="auto")
    ] = Field(
        default=None,
        description="Memory limit per device, e.g. 80GiB, or 'auto' (the device's memory; "
        "on CPU the RAM shared by the ranks).",
    )
    host_ram_bytes: Annotated[
        PositiveInt | None, Flag("host_ram", SIZE_OR_AUTO, shown_default="auto")
    ] = Field(
        default=None,
        description="Host RAM a node may use, e.g. 512GiB, or 'auto' (this one's).",
    )
    memory_margin: Annotated[float, Flag()] = Field(
        default=0.05,
        ge=0.0,
        lt=1.0,
        description="Prune above the limit minus this share of it (0.05 = 5%).",
    )
    prune: Annotated[bool, Flag("no_prune", negates=True)] = Field(
        default=True, description="Probe even what the memory model rules out."
    )
    global_batch: Annotated[PositiveInt | Literal["auto"] | None, Flag(unit=GLOBAL_BATCH)] = Field(
        default=None,
        description="Samples per optimizer step (default: the base config's, else the "
        "workload's), or 'auto' to search it up to --max-global-batch.",
    )
    max_global_batch: Annotated[PositiveInt | None, Flag()] = Field(
        default=None, description="Largest global batch with --global-batch auto."
    )

    @property
    def gpus(self) -> int:
        """Devices (or CPU ranks) the study may use in total: the largest world size."""
        return max(self.world_sizes)

    @property
    def searched_world_sizes(self) -> tuple[int, ...]:
        """The world sizes searched (--gpus 1-8 or 2,4,8); empty: one world size."""
        return self.world_sizes if len(self.world_sizes) > 1 else ()


class SearchSettings(BaseModel):
    """The search: its budget, its sampler, its end (the confirmation round, the loss check)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget_s: Annotated[PositiveFloat | None, Flag("budget", DURATION, per_run=True)] = Field(
        default=None,
        description="The study's total wall-clock budget: 90s, 30m, 2h, 1h30m. A new study "
        f"gets {format_duration(DEFAULT_BUDGET_S)}; a continued one keeps what is left of its "
        "own unless given a new total.",
    )
    max_trials: Annotated[PositiveInt | None, Flag(per_run=True)] = Field(
        default=None, description="Stop after this many new candidates are probed."
    )
    seed: Annotated[int | None, Flag()] = Field(default=None, description="Sampler seed.")
    sampler: Annotated[Literal["autotune", "tpe", "gp", "random", "grid"], Flag()] = Field(
        default="autotune",
        description="autotune (model-guided), tpe, gp, random, or grid (every valid candidate "
        "once).",
    )
    confirm: Annotated[bool, Flag("no_confirm", negates=True)] = Field(
        default=True,
        description="Skip the confirmation round (re-probing the top candidates, interleaved).",
    )
    retry_failed: Annotated[bool, Flag(per_run=True)] = Field(
        default=False,
        description="Probe once more the candidates whose probes failed (error, timeout), "
        "e.g. after fixing what failed: autotune run --study S --retry-failed.",
    )
    verify: Annotated[Literal["off", "on", "strict"], Flag(optional_value="on")] = Field(
        default="off",
        description="Before exporting, check that the best trains as its reference does "
        "(your base config, else fp32 at ZeRO-0; autotune verify), its time held back from "
        "the search: --verify alone, or --verify strict to set aside a best whose check "
        "differs and export the next best checked (up to two runners-up).",
    )

    @property
    def checks_loss(self) -> bool:
        """The best's loss is checked before the export (--verify or --verify strict)."""
        return self.verify != "off"

    @property
    def verify_strict(self) -> bool:
        """A best whose loss check differs is set aside for the next best checked."""
        return self.verify == "strict"


class ProbeSettings(BaseModel):
    """One probe: its steps, its time limit, its numerics, where its processes run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    warmup_steps: Annotated[PositiveInt, Flag()] = Field(
        default=2, description="Untimed optimizer steps per probe, at least."
    )
    timed_steps: Annotated[PositiveInt, Flag()] = Field(
        default=3, description="Timed optimizer steps per probe, at least."
    )
    max_timed_steps: Annotated[PositiveInt, Flag()] = Field(
        default=20,
        description="Timed steps at most; a probe stops once its spread is under 2%.",
    )
    early_stop: Annotated[bool, Flag("no_early_stop", negates=True)] = Field(
        default=True, description="Time every probe in full, even when clearly slower."
    )
    probe_timeout_s: Annotated[PositiveFloat | None, Flag("probe_timeout", DURATION)] = Field(
        default=None,
        description="Hard limit of one probe, e.g. 5m (default: derived from the workload).",
    )
    warm_workers: Annotated[bool, Flag("cold_probes", negates=True)] = Field(
        default=True,
        description="Start every probe as a new launch (as DeepSpeed's autotuner does) "
        "instead of keeping warm workers.",
    )
    tf32: Annotated[bool, Flag()] = Field(
        default=False,
        description="Let fp32 matmuls use TF32 on GPUs, as your training does if it sets "
        "torch.set_float32_matmul_precision('high') (default: IEEE fp32, PyTorch's default).",
    )
    executor: Annotated[Executor, Flag()] = Field(
        default="ray", description="'ray' (Ray core tasks) or 'local' (subprocesses, no Ray)."
    )
    ray_address: Annotated[str | None, Flag(per_run=True)] = Field(
        default=None,
        description="Join an existing Ray cluster: auto, HOST:PORT of its head (GCS) or "
        "ray://HOST:PORT; probes may span its nodes (default: a private Ray on this machine).",
    )


class StorageSettings(BaseModel):
    """Where the study is kept: its name, its storage, its files, who else drives it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    study_name: Annotated[str | None, Flag("study", per_run=True)] = Field(
        default=None,
        description="Study name (default: the workload's name); an existing one continues "
        "with the flags it was started with.",
    )
    storage_url: Annotated[str, Flag("storage", per_run=True)] = Field(
        default=DEFAULT_STORAGE,
        description="Optuna storage URL (any SQLAlchemy URL Optuna takes).",
    )
    trials_dir: Annotated[Path, Flag(unit=PATH, names_file=True)] = Field(
        default=Path("trials"), description="Folder for per-trial logs and the export."
    )
    shared: Annotated[bool, Flag(per_run=True)] = Field(
        default=False,
        description="Run side by side with other drivers of this study (a database they all "
        "reach, e.g. PostgreSQL): each takes its own proposals, none probes a candidate "
        "another has, and each runs for its own --budget.",
    )


class RunSettings(BaseModel):
    """What the user asked of one ``autotune run``, in sections (torchtitan's JobConfig is
    the model): what is tuned at the top, then the limits, the search, a probe, the storage
    and the training goal. Each setting is declared once: its type and unit, its default,
    its help (the description) and its flag (:class:`~autotune.flag.Flag` in its metadata;
    the command line is generated from these fields by :mod:`autotune.cli._flags`). A
    setting's name is unique across the sections, so :meth:`build` takes them flat.
    ``None`` fields are resolved later against the hardware and the workload
    (:func:`autotune.run.resolve_run`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # What is tuned: the workload or the user's script, the space and the base config.
    workload: Annotated[str, Flag(names_file=True)] = Field(
        description="Built-in workload (gpt-tiny, dit-s-8, llama3-8b, ...), "
        "hf:path/config.json[?seq=N&batch=N] (a local Hugging Face config, random weights), or "
        "path/to/file.py:function; a new study needs it or --script.",
    )
    script: ScriptConfig | None = Field(
        default=None,
        description="The user's training script is the probe (workload then names it); built "
        "from --script, its arguments and --script-arg.",
    )
    space: Annotated[str, Flag(names_file=True)] = Field(
        default="default", description="Search space: a YAML path or a built-in name."
    )
    base_config: Annotated[Path | None, Flag(unit=PATH, names_file=True)] = Field(
        default=None,
        description="Your DeepSpeed JSON (optimizer, scheduler ...); tuned keys override it.",
    )
    # Sections, in the order --help shows their flags.
    limits: LimitSettings = Field(
        default_factory=LimitSettings, description="Devices, memory, NVMe folder, batch."
    )
    search: SearchSettings = Field(
        default_factory=SearchSettings, description="Budget, sampler, the search's end."
    )
    probe: ProbeSettings = Field(
        default_factory=ProbeSettings, description="Steps, time limit, numerics, executor."
    )
    storage: StorageSettings = Field(
        default_factory=StorageSettings, description="Study name, storage URL, trials folder."
    )
    # What ranks configurations: its fields carry their own flags (--objective, ...).
    goal: TrainingGoal = Field(
        default_factory=TrainingGoal,
        description="What ranks configurations: throughput (the default), cost or a deadline, "
        "and the run's size and price where given.",
    )

    @classmethod
    def build(cls, **values: object) -> RunSettings:
        """Construct from settings named flat (``world_sizes=(2,)``, each placed in its
        section); a validation problem becomes one SettingsError line naming the flag."""
        nested: dict[str, object] = {}
        for name, value in values.items():
            section = _SECTION_OF.get(name)
            if section is None:
                nested[name] = value
            else:
                nested.setdefault(section, {})[name] = value  # type: ignore[index]
        try:
            return cls(**nested)
        except ValidationError as exc:
            raise SettingsError(problem_line(cls, exc)) from None


# The sections of RunSettings whose settings build() takes flat: each setting's section.
_SECTIONS = ("limits", "search", "probe", "storage")
_SECTION_OF = {
    name: section
    for section in _SECTIONS
    for name in RunSettings.model_fields[section].annotation.model_fields  # type: ignore[union-attr]
}
