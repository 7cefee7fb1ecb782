"""The interface a training backend implements, and the registry that names them.

A backend is everything specific to one training library: DeepSpeed
(:mod:`autotune.backends.deepspeed`) and torch's FSDP2 (:mod:`autotune.backends.fsdp2`),
each a package that implements :class:`TrainingBackend`, registered by one
:func:`register_backend` call. A candidate names its backend (``Candidate.backend``); the
probe, the memory model and the export ask :func:`get_backend` for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from autotune import events

if TYPE_CHECKING:
    from autotune.backends._memory_terms import ActivationProfile, Breakdown, ModelFacts
    from autotune.candidate import Candidate
    from autotune.hardware import Hardware
    from autotune.script_config import ScriptConfig


class BackendConfig(Protocol):
    """The library's config (a backend's config module and its validation).

    - ``name``: the name the registry knows the backend by ("deepspeed").
    - ``config_file_name``: the file the export writes the rendered config to, and the name
      a probe's trial folder keeps it under ("ds_config.json").
    - ``render_config(candidate, base, nvme_path=, largest_param_numel=)``: the candidate as
      the library's config, laid over the user's ``base`` config (None: the backend's
      default); the same dict for the probe, the memory model and the export.
      ``largest_param_numel`` sizes buffers that must hold one parameter's partition.
    - ``validate_config(config, world_size, accelerator)``: check the exported config with
      the library's own parser for ``world_size`` ranks; raise ExportError if it refuses.
    - ``with_fallback_optimizer(config)``: ``config`` stepping with the optimizer the backend
      falls back to where its own did not build (``ensure_ops``' report says when);
      ``uses_fallback_optimizer(config)`` tells whether a probed config did.
    - ``config_for_script(config, script)``: the rendered config as the user's own script
      is given it (probes and the export), for that script's kind.
    """

    name: str
    config_file_name: str

    def render_config(
        self,
        candidate: Candidate,
        base: dict[str, Any] | None = None,
        *,
        nvme_path: str | None = None,
        largest_param_numel: int | None = None,
    ) -> dict[str, Any]: ...

    def validate_config(
        self, config: dict[str, Any], world_size: int, accelerator: str = "cpu"
    ) -> None: ...

    def with_fallback_optimizer(self, config: dict[str, Any]) -> dict[str, Any]: ...

    def uses_fallback_optimizer(self, config: dict[str, Any]) -> bool: ...

    def config_for_script(self, config: dict[str, Any], script: ScriptConfig) -> dict[str, Any]: ...


class BackendSupport(Protocol):
    """What this machine and this study allow of the library (its ops, its torch floor).

    - ``torch_floor``: the oldest torch release (major, minor) the backend trains with;
      ``unavailable(script=)``: why a study cannot train with the backend here, in one line
      with the fix (the installed torch below ``torch_floor``; a ``script`` study, where
      the backend cannot probe the user's script), or None. A run drops such a backend
      from the space, and the study keeps the reason.
    - ``ensure_ops(hardware, offload_targets, emit=)``: build (once, cached) the compiled ops
      the candidates with these offload targets need, before any probe starts; returns the
      backend's report of what it built.
    - ``nvme_offload_problem(hardware)``: why NVMe offload cannot be served on this
      hardware (one line), or None; ``partial_offload_supported()``: whether the library
      can offload a share of the optimizer states (``offload_optimizer_ratio`` < 1).
    """

    torch_floor: tuple[int, int]

    def unavailable(self, *, script: bool) -> str | None: ...

    def ensure_ops(
        self,
        hardware: Hardware,
        offload_targets: Iterable[str] | None = None,
        emit: events.Emit = events.ignore,
    ) -> Any: ...

    def nvme_offload_problem(self, hardware: Hardware) -> str | None: ...

    def partial_offload_supported(self) -> bool: ...


class BackendEngine(Protocol):
    """The library on a probe's rank (a backend's engine module).

    - ``prepare_rank_process()``: once in a probe's rank process, before any candidate: what
      the library needs of the process (for DeepSpeed, op loads under kernel locks with the
      environment's build tools). ``start_process_group()``: on the rank, join the ranks'
      process group the library's own way, with the communication backend of
      ``_process_group.process_group_backend`` (a warm rank's group serves both backends).
    - ``sharded_build(candidate, config)``: a context under which the workload's model is
      built without a whole copy for this candidate (DeepSpeed's ZeRO-3: partitioned under
      ``zero.Init``; FSDP2: its parameters on the meta device, given memory shard by shard
      in ``initialize_engine``), or None to build it whole.
    - ``parameter_precision(candidate)``: the precision the model's parameters are built
      and held in on the rank (DeepSpeed: the candidate's; FSDP2: fp32, computing in the
      candidate's); its batches are made in it too.
    - ``initialize_engine(model, config, units)``: the training engine over ``model`` for
      ``config``: it has ``forward``/``backward``/``step`` as the probe times; ``units`` are
      the modules a sharding backend wraps one by one (the workload's ``shard_units``).
    - ``whole_parameters(model)``: a context in which the engine's parameters are whole (to
      load seeded weights).
    """

    def prepare_rank_process(self) -> None: ...

    def start_process_group(self) -> None: ...

    def sharded_build(
        self, candidate: Candidate, config: dict[str, Any]
    ) -> contextlib.AbstractContextManager[Any] | None: ...

    def parameter_precision(self, candidate: Candidate) -> str: ...

    def initialize_engine(
        self, model: Any, config: dict[str, Any], units: list[Any] | None = None
    ) -> Any: ...

    def whole_parameters(self, model: Any) -> contextlib.AbstractContextManager[Any]: ...


class BackendMemory(Protocol):
    """The library's memory terms (a backend's memory modules), which the memory model sums.

    - ``calibration_group(candidate)``: the candidates whose measured peaks calibrate one
      memory correction together (a ZeRO stage; FSDP2's sharding);
      ``holds_reduce_bucket(candidate)``: the library holds a gradient reduce bucket beside
      the model states between steps (DeepSpeed's ZeRO-3).
    - ``model_states(candidate, facts)``: the (device, host) bytes per rank of parameters,
      gradients and optimizer states held between steps.
    - ``transient_phases(candidate, facts, act, knobs, host)``: the device bytes beyond the
      model states in each phase of a step (forward, backward, step ...), and the host's
      bytes with what those phases add there.
      ``host_phases(candidate, facts, host)``: the host's bytes in each phase where they
      are below its peak (``host``: the steady bytes of ``model_states``); {} where the
      host holds its peak throughout. A CPU rank keeps device and host in one RAM, so its
      peak is the most the two hold in one phase.
    """

    def calibration_group(self, candidate: Candidate) -> str: ...

    def holds_reduce_bucket(self, candidate: Candidate) -> bool: ...

    def model_states(
        self, candidate: Candidate, facts: ModelFacts
    ) -> tuple[Breakdown, Breakdown]: ...

    def transient_phases(
        self,
        candidate: Candidate,
        facts: ModelFacts,
        act: ActivationProfile,
        knobs: dict[str, int],
        host: Breakdown,
    ) -> tuple[dict[str, Breakdown], Breakdown]: ...

    def host_phases(
        self, candidate: Candidate, facts: ModelFacts, host: Breakdown
    ) -> dict[str, Breakdown]: ...


class BackendExportText(Protocol):
    """What the export and the status say of the library (a backend's export-text module).

    - ``display_name``: the library's name in text ("DeepSpeed"); ``cpu_ranks_library``
      what trains on CPU ranks ("DeepSpeed's CPU accelerator") and ``cpu_ranks_runtime``
      what the export says runs them ("gloo" for FSDP2); ``engine_entry`` the call that
      hands the model to the library, in text ("`deepspeed.initialize`");
      ``shards_by_block``: the library wraps the model's transformer blocks one by one
      (FSDP2's units), so the export names the block class.
    - ``launch_script(origin, ranks, accelerator, threads_per_rank, env, config)``: the
      export's ``launch.sh`` that starts the user's script (its first argument) with the
      exported ``config`` and exports ``env`` (what production must set to compute as the
      probes did); ``script_launch_script(...)`` the one for a study of the user's own
      script, run with its tuned arguments; ``config_usage_lines(ranks, script_name)`` the
      summary's lines on how to use the config and ``launch.sh``. ``origin`` and
      ``script_name`` arrive printable, the arguments quoted for bash.
    - ``export_files(config, ranks, accelerator, block_class)``: the files the export writes
      beside the config (name to text; FSDP2's accelerate config), ``block_class`` naming
      the class of the model's transformer blocks; ``code_lines(config)`` the lines of
      code summary.md shows for a plain-torch script (none for DeepSpeed).
    - ``precision_actions(candidate)``: what the user's code must do about the candidate's
      precision under this library; ``setup_actions(candidate, base)``: what else it must do
      to train as the probes did (``base``: the user's base config).
    """

    display_name: str
    cpu_ranks_library: str
    cpu_ranks_runtime: str
    engine_entry: str
    shards_by_block: bool

    def launch_script(
        self,
        origin: str,
        ranks: int,
        accelerator: str,
        threads_per_rank: int,
        env: Mapping[str, str] | None = None,
        config: dict[str, Any] | None = None,
    ) -> str: ...

    def script_launch_script(
        self,
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
    ) -> str: ...

    def config_usage_lines(self, ranks: int, script_name: str | None) -> list[str]: ...

    def export_files(
        self, config: dict[str, Any], ranks: int, accelerator: str, block_class: str
    ) -> dict[str, str]: ...

    def code_lines(self, config: dict[str, Any]) -> list[str]: ...

    def precision_actions(self, candidate: Candidate) -> list[str]: ...

    def setup_actions(self, candidate: Candidate, base: dict[str, Any]) -> list[str]: ...


class TrainingBackend(
    BackendConfig, BackendSupport, BackendEngine, BackendMemory, BackendExportText, Protocol
):
    """What a training backend must provide: its roles (:data:`BACKEND_ROLES`), each
    answered by the backend's own modules, the only place its library's details are
    spelled; the rest of autotune calls these. Code that needs one role may take it alone
    (the memory model takes a :class:`BackendMemory`)."""


# The roles a backend plays, each a protocol of its own; every member is in one of them.
BACKEND_ROLES: tuple[type, ...] = (
    BackendConfig,
    BackendSupport,
    BackendEngine,
    BackendMemory,
    BackendExportText,
)


# The backend of a space that names none (its ``backend`` key left out).
DEFAULT_BACKEND = "deepspeed"

# Registered backends by name, each made on first use (its package is imported then).
BACKENDS: dict[str, Callable[[], TrainingBackend]] = {}


def register_backend(name: str, make: Callable[[], TrainingBackend]) -> None:
    """Make ``get_backend(name)`` return what ``make()`` builds."""
    BACKENDS[name] = make
    _made.pop(name, None)


_made: dict[str, TrainingBackend] = {}


def get_backend(name: str) -> TrainingBackend:
    """The registered backend called ``name``; ValueError naming the valid ones if none is."""
    if name not in BACKENDS:
        valid = ", ".join(sorted(BACKENDS)) or "none"
        raise ValueError(f"unknown training backend {name!r}; valid: {valid}")
    if name not in _made:
        _made[name] = BACKENDS[name]()
    return _made[name]


def prepare_rank_process() -> None:
    """Each registered backend's set-up of a probe's rank process, before it trains."""
    for name in BACKENDS:
        get_backend(name).prepare_rank_process()


def cpu_rank_libraries(names: Iterable[str]) -> list[str]:
    """What trains on CPU ranks for the backends ``names``, in the registry's order."""
    given = set(names)
    return [get_backend(name).cpu_ranks_library for name in BACKENDS if name in given]
