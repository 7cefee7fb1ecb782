"""The ``autotune`` command line: parse flags, build settings, call the library, print.

This is the only place that catches :class:`AutotuneError`: it prints the message on one
line (the traceback too with ``--debug``) and exits with code 2. Heavy libraries (torch,
deepspeed, ray) are imported inside the commands, never at import of this module.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from autotune.errors import AutotuneError
from autotune.settings import RunSettings, parse_duration, parse_size

app = typer.Typer(
    name="autotune",
    help="Find the fastest DeepSpeed configuration that fits your GPU memory, by search.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
# Piped or captured output (CI logs, `| less`) is not cut to rich's 80-column default:
# tables of candidates are wide and a wrapped header is unreadable. COLUMNS still wins.
_PIPE_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 250
# No markup: log lines and table cells carry text from probes and users (a gloo error
# quotes "[.../pair.cc:553]"), which rich would otherwise parse as tags and fail on.
console = Console(highlight=False, soft_wrap=True, width=_PIPE_WIDTH, markup=False)
error_console = Console(stderr=True, highlight=False, markup=False)

DEFAULT_STORAGE = "sqlite:///trials/autotune.db"
StorageOption = Annotated[
    str, typer.Option("--storage", help="Optuna storage URL (any SQLAlchemy URL Optuna takes).")
]
StudyOption = Annotated[
    str | None, typer.Option("--study", help="Study name (default: the only study, if one).")
]


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
) -> None:
    """Find the fastest DeepSpeed configuration that fits your GPU memory, by search."""


@app.command()
def run(
    workload: Annotated[
        str | None,
        typer.Option(help="Built-in workload (e.g. gpt-tiny) or path/to/file.py:function."),
    ] = None,
    space: Annotated[
        str | None, typer.Option(help="Search space: a YAML path or a built-in name [default].")
    ] = None,
    gpus: Annotated[
        int | None, typer.Option(help="Devices the study may use (CPU ranks without GPUs) [1].")
    ] = None,
    gpus_per_trial: Annotated[
        int | None, typer.Option(help="Devices one probe uses (default: all of --gpus).")
    ] = None,
    vram: Annotated[
        str | None,
        typer.Option(help="Memory limit per device, e.g. 80GiB, or 'auto' (device memory) [auto]."),
    ] = None,
    global_batch: Annotated[
        str | None,
        typer.Option(
            help="Samples per optimizer step (default: the base config's, else the "
            "workload's), or 'auto' to search it up to --max-global-batch."
        ),
    ] = None,
    max_global_batch: Annotated[
        int | None, typer.Option(help="Largest global batch with --global-batch auto.")
    ] = None,
    base_config: Annotated[
        Path | None,
        typer.Option(help="Your DeepSpeed JSON (optimizer, scheduler ...); tuned keys override."),
    ] = None,
    nvme_path: Annotated[
        Path | None, typer.Option(help="Folder on an NVMe disk, for nvme offload candidates.")
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option(
            help="The study's total wall-clock budget: 90s, 30m, 2h, 1h30m. A new study gets "
            "30m; a continued one keeps what is left of its own unless given a new total."
        ),
    ] = None,
    max_trials: Annotated[
        int | None, typer.Option(help="Stop after this many new candidates are probed.")
    ] = None,
    study: Annotated[
        str | None,
        typer.Option(help="Study name (default: the workload's name); an existing one continues."),
    ] = None,
    storage: StorageOption = DEFAULT_STORAGE,
    seed: Annotated[int | None, typer.Option(help="Sampler seed.")] = None,
    executor: Annotated[
        str | None, typer.Option(help="'ray' (default) or 'local' (subprocesses, no Ray).")
    ] = None,
    probe_timeout: Annotated[
        str | None,
        typer.Option(help="Hard limit of one probe, e.g. 5m (default: derived from the workload)."),
    ] = None,
    cold_probes: Annotated[
        bool,
        typer.Option(
            "--cold-probes",
            help="Start every probe as a new launch (as DeepSpeed's autotuner does) instead of "
            "keeping warm workers.",
        ),
    ] = False,
    no_prune: Annotated[
        bool, typer.Option("--no-prune", help="Probe even what the memory model rules out.")
    ] = False,
    memory_margin: Annotated[
        float | None,
        typer.Option(help="Prune above the limit minus this share of it [0.05 = 5%]."),
    ] = None,
    host_ram: Annotated[
        str | None,
        typer.Option(help="Host RAM a node may use, e.g. 512GiB, or 'auto' (this one's) [auto]."),
    ] = None,
    warmup_steps: Annotated[
        int | None, typer.Option(help="Untimed optimizer steps per probe [2].")
    ] = None,
    timed_steps: Annotated[
        int | None, typer.Option(help="Timed optimizer steps per probe, at least [3].")
    ] = None,
    max_timed_steps: Annotated[
        int | None,
        typer.Option(help="Timed steps at most; a probe stops once its spread is under 2% [20]."),
    ] = None,
    sampler: Annotated[
        str | None,
        typer.Option(
            help="autotune (model-guided, default), tpe, gp, random, or grid (every valid "
            "candidate once)."
        ),
    ] = None,
    no_confirm: Annotated[
        bool,
        typer.Option(
            "--no-confirm",
            help="Skip the confirmation round (re-probing the top candidates, interleaved).",
        ),
    ] = False,
    no_early_stop: Annotated[
        bool,
        typer.Option("--no-early-stop", help="Time every probe in full, even when clearly slower."),
    ] = False,
    trials_dir: Annotated[
        Path | None, typer.Option(help="Folder for per-trial logs and the export [trials].")
    ] = None,
    inject_fault: Annotated[
        str,
        typer.Option(hidden=True, help="Testing only: make every probe fail this way."),
    ] = "none",
) -> None:
    """Search the space for the fastest configuration that fits, by real probes.

    An existing study continues: flags not given are taken from the study, the budget is
    what the study has left, and interrupted probes are run again once."""
    from autotune.plan import plan_run
    from autotune.study import stored_run_flags
    from autotune.tuner import Tuner
    from autotune.workloads import workload_study_name

    if inject_fault not in ("none", "oom", "error", "crash", "hang"):
        raise AutotuneError(f"--inject-fault {inject_fault}: none, oom, error, crash or hang")
    given: dict[str, object] = {
        "workload": workload,
        "space": str(Path(space).resolve()) if space and Path(space).is_file() else space,
        "gpus": gpus,
        "gpus_per_trial": gpus_per_trial,
        "vram": vram,
        "global_batch": global_batch,
        "max_global_batch": max_global_batch,
        "base_config": None if base_config is None else str(base_config.resolve()),
        "nvme_path": None if nvme_path is None else str(nvme_path.resolve()),
        "seed": seed,
        "executor": executor,
        "probe_timeout": probe_timeout,
        "memory_margin": memory_margin,
        "host_ram": host_ram,
        "warmup_steps": warmup_steps,
        "timed_steps": timed_steps,
        "trials_dir": None if trials_dir is None else str(trials_dir.resolve()),
        "cold_probes": cold_probes or None,
        "no_prune": no_prune or None,
        "max_timed_steps": max_timed_steps,
        "sampler": sampler,
        "no_early_stop": no_early_stop or None,
        "no_confirm": no_confirm or None,
    }
    if study is None and workload is None:
        raise AutotuneError(
            "--workload is required for a new study (e.g. --workload gpt-tiny); to continue a "
            "study, pass --study NAME"
        )
    study_name = study or workload_study_name(workload or "")
    stored = stored_run_flags(storage, study_name)
    if not stored and workload is None:
        raise AutotuneError(
            f"--study {study_name}: no such study in {storage} to continue; start it with "
            "--workload W (and the other flags)"
        )
    flags = {**RUN_FLAG_DEFAULTS, **stored, **{k: v for k, v in given.items() if v is not None}}
    if flags["executor"] not in ("ray", "local"):
        raise AutotuneError(f"--executor {flags['executor']}: choose 'ray' or 'local'")
    settings = RunSettings.build(
        workload=flags["workload"],
        space=space or flags["space"],  # as typed, for messages; the study stores it resolved
        gpus=flags["gpus"],
        gpus_per_trial=flags["gpus_per_trial"],
        vram_limit_bytes=_size_or_auto(flags["vram"], "--vram"),
        global_batch=_parse_global_batch(flags["global_batch"]),
        max_global_batch=flags["max_global_batch"],
        base_config=base_config or flags["base_config"],
        nvme_path=nvme_path or flags["nvme_path"],
        budget_s=None if budget is None else parse_duration(budget, flag="--budget"),
        max_trials=max_trials,
        study_name=study_name,
        storage_url=storage,
        seed=flags["seed"],
        executor=flags["executor"],
        probe_timeout_s=None
        if flags["probe_timeout"] is None
        else parse_duration(flags["probe_timeout"], flag="--probe-timeout"),
        trials_dir=trials_dir or flags["trials_dir"],
        warmup_steps=flags["warmup_steps"],
        timed_steps=flags["timed_steps"],
        prune=not flags["no_prune"],
        warm_workers=not flags["cold_probes"],
        memory_margin=flags["memory_margin"],
        host_ram_bytes=_size_or_auto(flags["host_ram"], "--host-ram"),
        max_timed_steps=flags["max_timed_steps"],
        sampler=flags["sampler"],
        early_stop=not flags["no_early_stop"],
        confirm=not flags["no_confirm"],
    )
    plan = plan_run(settings)
    if stored:
        inherited = sorted(
            k for k in stored if given.get(k) is None and stored[k] not in (None, False)
        )
        console.print(f"continuing study {study_name!r} with its flags ({', '.join(inherited)})")
    console.print(plan.hardware.describe(settings.gpus))
    batch = plan.config.global_batch or f"auto (up to {plan.config.max_global_batch})"
    console.print(
        f"workload {plan.workload.describe()}; global batch {batch}, "
        f"{plan.config.gpus_per_trial} rank(s) per probe, memory limit "
        f"{_gib(plan.config.vram_limit_bytes)} per rank"
    )
    for note in plan.notes:
        console.print(f"note: {note}")
    tuner = Tuner(plan, log=console.print, fault=inject_fault, run_flags=flags)
    summary = tuner.run()
    console.print(
        f"stopped: {summary.stop_reason or 'done'}; {summary.probes} probe(s) in "
        f"{summary.elapsed_s:.0f} s, {summary.pruned + summary.screened} candidate(s) ruled "
        "out without a probe, "
        f"{summary.duplicates} duplicate proposal(s) skipped"
    )
    if summary.confirmation:
        console.print(f"confirmed: {summary.confirmation}")
    if summary.export_path:
        console.print(
            f"best: trial {summary.best_trial} {summary.best_label}: "
            f"{summary.best_samples_per_s:.1f} samples/s, {summary.best_tokens_per_s:.0f} "
            f"tokens/s, peak {_gib(summary.best_peak_bytes)} of "
            f"{_gib(summary.vram_limit_bytes)} per rank"
        )
        console.print(f"exported: {summary.export_path} (with launch.sh and summary.md beside it)")
    if summary.stop_reason == "interrupted":
        raise typer.Exit(130)


# What a new study gets for a flag not given (a continued study keeps its own).
RUN_FLAG_DEFAULTS: dict[str, object] = {
    "space": "default",
    "gpus": 1,
    "gpus_per_trial": None,
    "vram": "auto",
    "global_batch": None,
    "max_global_batch": None,
    "base_config": None,
    "nvme_path": None,
    "seed": None,
    "executor": "ray",
    "probe_timeout": None,
    "memory_margin": 0.05,
    "host_ram": "auto",
    "warmup_steps": 2,
    "timed_steps": 3,
    "max_timed_steps": 20,
    "sampler": "autotune",
    "no_early_stop": False,
    "no_confirm": False,
    "trials_dir": "trials",
    "cold_probes": False,
    "no_prune": False,
}


def _size_or_auto(text: object, flag: str) -> int | None:
    return None if text in (None, "auto") else parse_size(str(text), flag=flag)


@app.command()
def space(
    space: Annotated[str, typer.Option(help="Search space: a YAML path or a built-in name.")] = (
        "default"
    ),
    gpus: Annotated[int, typer.Option(help="Ranks per probe (CPU ranks without GPUs).")] = 1,
    workload: Annotated[
        str, typer.Option(help="Workload whose default global batch to use.")
    ] = "gpt-tiny",
    global_batch: Annotated[
        str | None, typer.Option(help="Samples per optimizer step, or 'auto'.")
    ] = None,
    max_global_batch: Annotated[
        int | None, typer.Option(help="Largest global batch with --global-batch auto.")
    ] = None,
    nvme_path: Annotated[Path | None, typer.Option(help="Folder for nvme offload.")] = None,
    examples: Annotated[int, typer.Option(help="How many example candidates to show.")] = 5,
) -> None:
    """Count the valid candidates of a space on this hardware, per dimension, with examples."""
    from autotune.report import space_report

    console.print(
        space_report(
            space,
            gpus=gpus,
            workload=workload,
            global_batch=_parse_global_batch(global_batch),
            max_global_batch=max_global_batch,
            nvme_path=nvme_path,
            examples=examples,
        )
    )


@app.command()
def plan(
    workload: Annotated[str, typer.Option(help="Built-in workload or path/to/file.py:fn.")],
    gpus: Annotated[int, typer.Option(help="GPUs of the target machine.")],
    vram: Annotated[str, typer.Option(help="Memory of each target GPU, e.g. 80GiB.")],
    global_batch: Annotated[
        int | None, typer.Option(help="Samples per optimizer step (default: the workload's).")
    ] = None,
    host_ram: Annotated[
        str, typer.Option(help="Host RAM of a node, e.g. 1TiB, or 'auto' (this machine's).")
    ] = "auto",
    space: Annotated[str, typer.Option(help="Search space: a YAML path or a built-in name.")] = (
        "default"
    ),
    memory_margin: Annotated[
        float, typer.Option(help="Count as fitting below the limit minus this share of it.")
    ] = 0.05,
    all_rows: Annotated[bool, typer.Option("--all", help="List every candidate.")] = False,
) -> None:
    """What fits, without a GPU: predicted memory of every valid candidate on a target."""
    from autotune.report import plan_report

    if gpus < 1:
        raise AutotuneError(f"--gpus {gpus}: give at least 1 GPU")
    console.print(
        plan_report(
            workload,
            gpus=gpus,
            vram_bytes=parse_size(vram, flag="--vram"),
            global_batch=global_batch,
            host_ram_bytes=None if host_ram == "auto" else parse_size(host_ram, flag="--host-ram"),
            space_ref=space,
            margin=memory_margin,
            limit_rows=None if all_rows else 40,
        )
    )


@app.command("export")
def export_command(
    out: Annotated[Path, typer.Option("-o", "--out", help="Folder to write the files into.")],
    study: StudyOption = None,
    trial: Annotated[
        int | None, typer.Option(help="Trial number (default: the best feasible).")
    ] = None,
    storage: StorageOption = DEFAULT_STORAGE,
) -> None:
    """Write ds_config.json, launch.sh and summary.md of the best (or a chosen) trial."""
    from autotune.export import export
    from autotune.study import load_existing_study

    loaded = load_existing_study(storage, study)
    exported = export(loaded, out, trial_number=trial)
    console.print(f"trial {exported.trial} ({exported.label}) exported:")
    for path in (exported.ds_config, exported.launch, exported.summary):
        console.print(f"  {path}")


@app.command()
def status(study: StudyOption = None, storage: StorageOption = DEFAULT_STORAGE) -> None:
    """Show a study's trials: candidate, status, samples/s, peak memory against the limit."""
    from autotune.report import trials_table
    from autotune.study import load_existing_study

    loaded = load_existing_study(storage, study)
    console.print(trials_table(loaded))


def _parse_global_batch(text: str | None) -> int | str | None:
    if text is None or text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise AutotuneError(f"--global-batch {text}: give a positive integer or 'auto'") from None


def _gib(size_bytes: int) -> str:
    from autotune.settings import format_bytes

    return format_bytes(size_bytes)


def main(argv: list[str] | None = None) -> int:
    """Entry point: one line per error, exit code 2; tracebacks only with --debug."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    # A parent that runs Ray (a notebook, a test harness) hands us SIGCHLD ignored; we start
    # and wait for subprocesses, so take the default back (see restore_child_signals).
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name="autotune", standalone_mode=False)
    except AutotuneError as exc:
        if debug:
            raise
        error_console.print(f"autotune: error: {exc}", soft_wrap=True, markup=False)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        error_console.print("autotune: aborted", markup=False)
        return 130
    except Exception as exc:
        # Usage errors of the vendored click (typer >= 0.29) or of click itself.
        if debug or not hasattr(exc, "format_message"):
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":
            console.print(exc.format_message(), markup=False)
            return 0
        hint = " (see autotune --help)" if getattr(exc, "ctx", None) is not None else ""
        message = " ".join(exc.format_message().split())
        error_console.print(f"autotune: error: {message}{hint}", soft_wrap=True, markup=False)
        return 2
    except KeyboardInterrupt:
        error_console.print("autotune: interrupted", markup=False)
        return 130
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
