"""Run settings (pydantic) and the parsers for the units users type: ``2h``, ``80GiB``.

The models are strict (``extra="forbid"``) and frozen; every field says what it means and
carries its unit in its name. Parsers raise :class:`SettingsError` with one actionable line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError

from autotune.errors import SettingsError
from autotune.script_config import ScriptConfig
from autotune.training_goal import TrainingGoal

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_DURATION_FULL = re.compile(r"^(?:\d+(?:\.\d+)?[dhms])+$")
_SECONDS_PER_UNIT = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}

# Binary (IEC) and decimal (SI) units; a bare number is bytes.
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([a-zA-Z]*)$")

# What --tf32 means for a training process's environment. ATen reads the variable once per
# process (Context::allowTF32CuBLAS): "1" makes cuBLAS use TF32 for fp32 matmuls whatever
# float32_matmul_precision says; NGC's PyTorch containers export it.
TF32_CUBLAS_OVERRIDE_ENV = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"


def tf32_cublas_override(precision: str) -> str:
    """The value of :data:`TF32_CUBLAS_OVERRIDE_ENV` for a process whose fp32 matmuls follow
    ``precision`` (torch's float32_matmul_precision): "0" for "highest" (IEEE fp32; an
    inherited "1" would force TF32), else "1" (TF32, whatever the training script sets)."""
    return "0" if precision == "highest" else "1"


def parse_duration(text: str, *, flag: str = "--budget") -> float:
    """``"90s"``, ``"30m"``, ``"2h"``, ``"1h30m"``, ``"3d"`` -> seconds (units in d, h, m,
    s order)."""
    value = text.strip().lower()
    if not _DURATION_FULL.match(value):
        raise SettingsError(
            f"{flag}: cannot read duration {text!r}; use a number with a unit d, h, m or s, "
            "e.g. 90s, 30m, 2h, 1h30m or 3d"
        )
    parts = _DURATION_PART.findall(value)
    units = [unit for _, unit in parts]
    if units != sorted(set(units), key="dhms".index):
        raise SettingsError(
            f"{flag}: duration {text!r} repeats or misorders its units; write days, hours, "
            "minutes, then seconds, e.g. 1h30m"
        )
    seconds = sum(float(number) * _SECONDS_PER_UNIT[unit] for number, unit in parts)
    if seconds <= 0:
        raise SettingsError(f"{flag}: duration {text!r} is zero; give a positive duration")
    return seconds


def parse_size(text: str, *, flag: str = "--vram") -> int:
    """``"80GiB"``, ``"512MiB"``, ``"16GB"``, ``"1073741824"`` -> bytes."""
    match = _SIZE.match(text.strip())
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise SettingsError(
            f"{flag}: cannot read size {text!r}; use a number with a unit such as 80GiB, "
            "512MiB or 16GB (GiB = 2^30 bytes, GB = 10^9 bytes)"
        )
    size_bytes = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if size_bytes <= 0:
        raise SettingsError(f"{flag}: size {text!r} is zero; give a positive size")
    return size_bytes


_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@\s]*@")


def mask_url(url: str) -> str:
    """A storage URL as it may be printed: a password in it replaced by ``***``."""
    return _URL_PASSWORD.sub(r"\1***@", url)


def format_bytes(size_bytes: float) -> str:
    """Human-readable binary size, e.g. ``1.50 GiB``."""
    value = float(size_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


Executor = Literal["ray", "local"]

DEFAULT_BUDGET_S = 30 * 60.0  # what a new study gets without --budget
DEFAULT_STORAGE = "sqlite:///trials/autotune.db"
# Optimizer steps of each loss-parity run of `autotune verify`: bf16's tolerance is still
# under 10% at the tenth (autotune.study.loss_parity), and 10 steps of a tiny model take
# seconds on CPU ranks.
DEFAULT_VERIFY_STEPS = 10

# Settings fields whose flag is spelled differently (the flag drops the unit suffix).
_FLAG_OF_FIELD = {
    "vram_limit_bytes": "--vram",
    "budget_s": "--budget",
    "study_name": "--study",
    "storage_url": "--storage",
    "probe_timeout_s": "--probe-timeout",
    "host_ram_bytes": "--host-ram",
}


class RunSettings(BaseModel):
    """What the user asked of one ``autotune run``; ``None`` fields are resolved later
    against the hardware and the workload (see :mod:`autotune.run._tuner`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload: str = Field(description="Built-in workload name or path/to/file.py:function.")
    space: str = Field(
        default="default", description="Search-space YAML: a path or a name in search_spaces/."
    )
    gpus: PositiveInt = Field(description="Devices (or CPU ranks) the study may use in total.")
    gpus_per_trial: PositiveInt | None = Field(
        default=None, description="Devices one probe uses; default all of gpus (production size)."
    )
    world_sizes: tuple[PositiveInt, ...] = Field(
        default=(),
        description="World sizes searched (--gpus 1-8 or 2,4,8): the ranks of a probe are a "
        "dimension of the study, gpus their largest; empty: one world size.",
    )
    vram_limit_bytes: PositiveInt | None = Field(
        default=None, description="Peak memory one rank may reach; None means the device's memory."
    )
    global_batch: PositiveInt | Literal["auto"] | None = Field(
        default=None,
        description="Samples per optimizer step over all ranks; None: the base config's or the "
        "workload's; 'auto': searched up to max_global_batch.",
    )
    max_global_batch: PositiveInt | None = Field(
        default=None, description="Largest global batch when global_batch is 'auto'."
    )
    base_config: Path | None = Field(
        default=None, description="The user's DeepSpeed JSON; tuned keys are laid over it."
    )
    nvme_path: Path | None = Field(
        default=None, description="Folder on an NVMe disk for nvme offload candidates."
    )
    budget_s: PositiveFloat | None = Field(
        default=None,
        description="The study's total wall-clock budget in seconds; None: what the study "
        "stored (continuing), else DEFAULT_BUDGET_S.",
    )
    max_trials: PositiveInt | None = Field(
        default=None, description="Stop after this many new candidates have been evaluated."
    )
    study_name: str | None = Field(
        default=None, description="Optuna study name; default: the workload's name."
    )
    storage_url: str = Field(
        default=DEFAULT_STORAGE, description="Any SQLAlchemy URL Optuna accepts."
    )
    trials_dir: Path = Field(
        default=Path("trials"), description="Folder for per-trial logs and the exported config."
    )
    seed: int | None = Field(default=None, description="Seed of the sampler.")
    executor: Executor = Field(
        default="ray", description="'ray' (Ray core tasks) or 'local' (subprocesses, no Ray)."
    )
    ray_address: str | None = Field(
        default=None,
        description="An existing Ray cluster to join (auto, HOST:PORT, ray://HOST:PORT); "
        "None: a private Ray on this machine, on loopback only.",
    )
    warm_workers: bool = Field(
        default=True,
        description="Keep probe process groups alive between probes (cold: one launch each).",
    )
    probe_timeout_s: PositiveFloat | None = Field(
        default=None,
        description="Hard wall-clock limit of one probe; None: derived from the workload.",
    )
    prune: bool = Field(
        default=True, description="Skip candidates the memory model predicts over the limit."
    )
    memory_margin: float = Field(
        default=0.05,
        ge=0.0,
        lt=1.0,
        description="Prune when the predicted peak exceeds the limit minus this share of it.",
    )
    host_ram_bytes: PositiveInt | None = Field(
        default=None, description="Host RAM a node may use; None: this machine's RAM."
    )
    warmup_steps: PositiveInt = Field(
        default=2, description="Optimizer steps run before timing (also where memory is traced)."
    )
    timed_steps: PositiveInt = Field(
        default=3, description="Timed optimizer steps, at least (more until the spread settles)."
    )
    max_timed_steps: PositiveInt = Field(
        default=20,
        description="Timed steps at most: a probe times until the 95% interval of its step "
        "time is within 2% of the mean, or this many steps.",
    )
    sampler: Literal["autotune", "tpe", "gp", "random", "grid"] = Field(
        default="autotune",
        description="autotune: model-guided (memory + cost model); tpe/gp/random: Optuna's; "
        "grid: every valid candidate once.",
    )
    confirm: bool = Field(
        default=True,
        description="Re-probe the top candidates, interleaved, before choosing the winner.",
    )
    early_stop: bool = Field(
        default=True, description="Stop a probe once it is clearly slower than the best so far."
    )
    verify: bool = Field(
        default=False,
        description="After the search and its confirmation round, check that the best trains "
        "as its reference does (autotune verify), before the export; its time is held back "
        "from the search.",
    )
    verify_strict: bool = Field(
        default=False,
        description="As verify; a best whose loss check differs is set aside and the next best "
        "is checked instead (the best and up to two runners-up), before the export.",
    )
    shared: bool = Field(
        default=False,
        description="Drive the study side by side with other drivers (each its own proposals).",
    )
    tf32: bool = Field(
        default=False,
        description="fp32 matmuls may use TF32 (torch float32_matmul_precision 'high'), as a "
        "production run that sets it; False: IEEE fp32, PyTorch's default.",
    )
    script: ScriptConfig | None = Field(
        default=None,
        description="The user's training script is the probe (workload then names it).",
    )
    retry_failed: bool = Field(
        default=False,
        description="Probe once more the candidates whose probes failed (error, timeout) "
        "or that failures of their precision left unprobed.",
    )
    goal: TrainingGoal = Field(
        default_factory=TrainingGoal,
        description="What ranks configurations: throughput (the default), cost or a deadline, "
        "and the run's size and price where given.",
    )

    @classmethod
    def build(cls, **values: object) -> RunSettings:
        """Construct from flags; a validation problem becomes one SettingsError line."""
        try:
            return cls(**values)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "settings"
            flag = _FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-"))
            raise SettingsError(
                f"{flag}: {first['msg'].lower()}, got {first.get('input')!r}"
            ) from None
