"""The commands that look at a study or a space: ``status``, ``space``, ``plan``,
``export``, ``verify``, ``dashboard``, ``report``; and what ``run`` writes for people after a
run.

Each of ``status``, ``space``, ``plan``, ``export`` and ``verify`` prints text by default
and one JSON document with ``--json`` (:mod:`autotune.views._json_documents`).
:mod:`autotune.cli` registers these functions as its commands; heavy libraries are imported
inside them.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from autotune.cli._flags import RunFlags
from autotune.errors import AutotuneError
from autotune.settings import DEFAULT_STORAGE, DEFAULT_VERIFY_STEPS
from autotune.units import parse_global_batch, parse_size

if TYPE_CHECKING:
    from autotune.study import Best

# As the CLI's console: wide tables are not cut to 80 columns in a pipe; no markup.
console = Console(
    highlight=False,
    soft_wrap=True,
    width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 250,
    markup=False,
)

StorageOption = Annotated[
    str, typer.Option("--storage", help="Optuna storage URL (any SQLAlchemy URL Optuna takes).")
]
StudyOption = Annotated[
    str | None, typer.Option("--study", help="Study name (default: the only study, if one).")
]
JsonOption = Annotated[
    bool,
    typer.Option("--json", help="Print one JSON document on stdout (keys: docs/json.md)."),
]


def _print_json(document: dict[str, object]) -> None:
    from autotune.views import dumps

    sys.stdout.write(dumps(document))
    sys.stdout.flush()


@contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """With ``--json``, stdout holds the document alone: what libraries print meanwhile
    (DeepSpeed logs to stdout when imported, native code writes to fd 1) goes to stderr."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def space(
    space: Annotated[str, typer.Option(help="Search space: a YAML path or a built-in name.")] = (
        "default"
    ),
    gpus: Annotated[int, typer.Option(min=1, help="Ranks per probe (CPU ranks without GPUs).")] = 1,
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
    examples: Annotated[int, typer.Option(min=0, help="How many example candidates to show.")] = 5,
    as_json: JsonOption = False,
) -> None:
    """Count the valid candidates of a space on this hardware, per dimension, with examples."""
    from autotune.views import space_facts, space_report

    with _stdout_to_stderr(as_json):
        facts = space_facts(
            space,
            gpus=gpus,
            workload=workload,
            global_batch=None if global_batch is None else parse_global_batch(global_batch),
            max_global_batch=max_global_batch,
            nvme_path=nvme_path,
            examples=examples,
        )
    if as_json:
        from autotune.views import space_document

        _print_json(space_document(facts))
    else:
        console.print(space_report(facts))


GpusOption = Annotated[
    str,
    typer.Option(
        help="GPUs of the target machine; with --study also a range (1-8) or a list (8,16,64) "
        "of world sizes to predict."
    ),
]


def _goal_help(flag: str) -> str:
    """A goal flag's help, the one ``autotune run`` shows (one description for both)."""
    return "With --study: " + str(RunFlags.model_fields[flag].description)


ObjectiveOption = Annotated[str, typer.Option(help=_goal_help("objective"))]
PriceOption = Annotated[float | None, typer.Option(help=_goal_help("gpu_hour_price"))]
TokensOption = Annotated[str | None, typer.Option(help=_goal_help("train_tokens"))]
SamplesOption = Annotated[str | None, typer.Option(help=_goal_help("train_samples"))]
DeadlineOption = Annotated[str | None, typer.Option(help=_goal_help("deadline"))]
PerNodeOption = Annotated[int, typer.Option(min=1, help="With --study: GPUs per node.")]
BatchOption = Annotated[
    int | None, typer.Option(min=1, help="Samples per optimizer step (default: the workload's).")
]
HostRamOption = Annotated[
    str, typer.Option(help="Host RAM of a node, e.g. 1TiB, or 'auto' (this machine's).")
]
SpaceOption = Annotated[str, typer.Option(help="Search space: a YAML path or a built-in name.")]
MarginOption = Annotated[
    float,
    typer.Option(min=0.0, max=1.0, help="Count as fitting below the limit minus this share of it."),
]


def plan(
    workload: Annotated[
        str | None, typer.Option(help="Built-in workload or path/to/file.py:fn.")
    ] = None,
    gpus: GpusOption = "1",
    vram: Annotated[
        str | None,
        typer.Option(help="Memory of each target GPU, e.g. 80GiB (with --study: its limit)."),
    ] = None,
    study: StudyOption = None,
    storage: StorageOption = DEFAULT_STORAGE,
    global_batch: BatchOption = None,
    host_ram: HostRamOption = "auto",
    space: SpaceOption = "default",
    memory_margin: MarginOption = 0.05,
    objective: ObjectiveOption = "throughput",
    gpu_hour_price: PriceOption = None,
    train_tokens: TokensOption = None,
    train_samples: SamplesOption = None,
    deadline: DeadlineOption = None,
    gpus_per_node: PerNodeOption = 8,
    all_rows: Annotated[bool, typer.Option("--all", help="List every candidate.")] = False,
    as_json: JsonOption = False,
) -> None:
    """What fits, without a GPU: predicted memory of every valid candidate on a target
    (--workload); or, with --study, what the study's configurations would do on other
    numbers of GPUs, from its fitted cost model (and their time and cost to train)."""
    if study is None and workload is None:
        raise AutotuneError(
            "plan: give --workload W (the memory of its candidates on a target) or --study S "
            "(a study's configurations at other numbers of GPUs)"
        )
    if study is None:
        assert workload is not None
        _memory_plan(
            workload, gpus, vram, global_batch, host_ram, space, memory_margin, all_rows, as_json
        )
        return
    _forecast_plan(
        study=study,
        storage=storage,
        gpus=gpus,
        vram=vram,
        global_batch=global_batch,
        goal_flags={
            "objective": objective,
            "gpu_hour_price": gpu_hour_price,
            "train_tokens": train_tokens,
            "train_samples": train_samples,
            "deadline": deadline,
        },
        gpus_per_node=gpus_per_node,
        all_rows=all_rows,
        as_json=as_json,
    )


def _memory_plan(
    workload: str,
    gpus: str,
    vram: str | None,
    global_batch: int | None,
    host_ram: str,
    space: str,
    memory_margin: float,
    all_rows: bool,
    as_json: bool,
) -> None:
    """``autotune plan --workload W``: every valid candidate's memory on the target."""
    from autotune.memory import plan_candidates
    from autotune.views import plan_report

    if memory_margin >= 1.0:
        raise AutotuneError(
            f"'--memory-margin' {memory_margin:g}: give a share of the limit below 1, e.g. 0.05"
        )
    if vram is None:
        raise AutotuneError("--vram: give the memory of each target GPU, e.g. 80GiB")
    with _stdout_to_stderr(as_json):
        planned = plan_candidates(
            workload,
            gpus=_one_count(gpus),
            vram_bytes=parse_size(vram, flag="--vram"),
            global_batch=global_batch,
            host_ram_bytes=None if host_ram == "auto" else parse_size(host_ram, flag="--host-ram"),
            space_ref=space,
            margin=memory_margin,
        )
    if as_json:
        from autotune.views import plan_document

        _print_json(plan_document(planned))  # every candidate: --all is for the table
    else:
        console.print(plan_report(planned, limit_rows=None if all_rows else 40))


def _one_count(gpus: str) -> int:
    from autotune.units import parse_world_sizes

    sizes = parse_world_sizes(gpus)
    if len(sizes) != 1:
        raise AutotuneError(
            f"--gpus {gpus}: a memory plan of a workload takes one number of GPUs; a range or "
            "a list is for autotune plan --study S"
        )
    return sizes[0]


def _forecast_plan(
    *,
    study: str | None,
    storage: str,
    gpus: str,
    vram: str | None,
    global_batch: int | None,
    goal_flags: dict[str, object],
    gpus_per_node: int,
    all_rows: bool,
    as_json: bool,
) -> None:
    """``autotune plan --study S --gpus N``: the study's configurations at N GPUs."""
    from autotune.run.forecast import forecast
    from autotune.study import load_existing_study
    from autotune.units import parse_world_sizes

    goal = RunFlags.goal_of(goal_flags)
    sizes = parse_world_sizes(gpus)
    limit = None if vram is None else parse_size(vram, flag="--vram")
    with _stdout_to_stderr(as_json):
        loaded = load_existing_study(storage, study)
        predicted = forecast(
            loaded,
            world_sizes=sizes,
            goal=goal,
            gpus_per_node=gpus_per_node,
            global_batch=global_batch,
            vram_limit_bytes=limit,
        )
    if as_json:
        from autotune.views import forecast_document

        _print_json(forecast_document(predicted))
    else:
        from autotune.views import forecast_report

        console.print(forecast_report(predicted, limit_rows=None if all_rows else 40))


def export(
    out: Annotated[Path, typer.Option("-o", "--out", help="Folder to write the files into.")],
    study: StudyOption = None,
    trial: Annotated[
        int | None, typer.Option(help="Trial number (default: the best feasible).")
    ] = None,
    storage: StorageOption = DEFAULT_STORAGE,
    as_json: JsonOption = False,
) -> None:
    """Write ds_config.json, launch.sh and summary.md of the best (or a chosen) trial."""
    from autotune.export import export as export_files
    from autotune.study import load_existing_study

    with _stdout_to_stderr(as_json):
        loaded = load_existing_study(storage, study)
        exported = export_files(loaded, out, trial_number=trial)
    if as_json:
        from autotune.study import best
        from autotune.views import export_document

        _print_json(export_document(loaded.study_name, exported, best.of_study(loaded)))
        return
    console.print(f"trial {exported.trial} ({exported.label}) exported:")
    for path in (exported.config_file, exported.launch, exported.summary):
        console.print(f"  {path}")


def status(
    study: StudyOption = None, storage: StorageOption = DEFAULT_STORAGE, as_json: JsonOption = False
) -> None:
    """Show a study's trials: candidate, status, samples/s, peak memory against the limit."""
    from autotune.study import load_existing_study

    if as_json:
        from autotune.views import status_document

        with _stdout_to_stderr(True):
            document = status_document(load_existing_study(storage, study))
        _print_json(document)
        return
    loaded = load_existing_study(storage, study)
    from autotune.views import goal_lines, loss_check_lines, trials_table

    console.print(trials_table(loaded))
    for text in goal_lines(loaded):
        console.print(text)
    for text in loss_check_lines(loaded):
        console.print(text)


@contextmanager
def _first_interrupt_sets(event: threading.Event) -> Iterator[None]:
    """The first Ctrl-C sets ``event`` (the work stops in order and says so); the second
    raises KeyboardInterrupt at once."""

    def on_interrupt(signum: int, frame: object) -> None:
        if event.is_set():
            raise KeyboardInterrupt
        event.set()
        print("stopping (Ctrl-C again to quit at once)", file=sys.stderr, flush=True)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def verify(
    study: StudyOption = None,
    trial: Annotated[
        int | None, typer.Option(help="Trial number (default: the best feasible).")
    ] = None,
    steps: Annotated[
        int, typer.Option(min=1, help="Optimizer steps each run trains.")
    ] = DEFAULT_VERIFY_STEPS,
    storage: StorageOption = DEFAULT_STORAGE,
    as_json: JsonOption = False,
) -> None:
    """Train the best (or a chosen) trial and its reference (your base config, else fp32
    at ZeRO-0) from one seed on one global batch, compare their losses step by step, and
    keep the verdict in the study."""
    from autotune.cli._render import line
    from autotune.run.loss_check import check_loss
    from autotune.study import load_existing_study

    def show(event: object) -> None:
        text = line(event)  # type: ignore[arg-type]
        if text is not None:
            console.print(text)

    cancel = threading.Event()
    with _stdout_to_stderr(as_json), _first_interrupt_sets(cancel):
        loaded = load_existing_study(storage, study)
        checked = check_loss(loaded, trial=trial, steps=steps, emit=show, cancel=cancel)
    if as_json:
        from autotune.views import loss_check_document

        _print_json(loss_check_document(loaded.study_name, checked))


def dashboard(
    study: StudyOption = None,
    storage: StorageOption = DEFAULT_STORAGE,
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    host: Annotated[
        str, typer.Option(help="Address to bind; anything but 127.0.0.1 opens it to others.")
    ] = "127.0.0.1",
) -> None:
    """Serve the study in optuna-dashboard, with a note on every trial and on the study."""
    from autotune.study import load_existing_study, open_storage
    from autotune.views import LOOPBACK, annotate, serve

    loaded = load_existing_study(storage, study)
    opened = open_storage(storage)
    changed = annotate(loaded, opened)
    if host not in LOOPBACK:
        console.print(
            f"warning: --host {host}: the dashboard has no login and lets every visitor edit "
            "notes and delete studies; anyone who can reach this address can"
        )
    study_id = opened.get_study_id_from_name(loaded.study_name)
    shown = f"[{host}]" if ":" in host else host
    console.print(
        f"optuna-dashboard: http://{shown}:{port}/dashboard/studies/{study_id} "
        f"(study {loaded.study_name!r}, {changed} note(s) updated); Ctrl-C stops it"
    )
    serve(storage, host, port)


def report(
    study: StudyOption = None,
    storage: StorageOption = DEFAULT_STORAGE,
    out: Annotated[Path, typer.Option("-o", "--out", help="The HTML file to write.")] = Path(
        "report.html"
    ),
) -> None:
    """Write one self-contained HTML page of the study: plots, decision, exported config."""
    from autotune.study import load_existing_study
    from autotune.views import write_report

    loaded = load_existing_study(storage, study)
    console.print(f"report: {write_report(loaded, out).resolve()}")


# Registered by autotune.cli in this order, after ``run``.
COMMANDS = {
    "space": space,
    "plan": plan,
    "export": export,
    "status": status,
    "verify": verify,
    "dashboard": dashboard,
    "report": report,
}


def after_run(storage: str, name: str, export_dir: str | None) -> list[str]:
    """After ``run``: the dashboard's notes and ``report.html`` beside the export. Lines to
    print; a failure here costs a warning, never the run's result."""
    from autotune.study import load_existing_study, open_storage

    try:
        loaded = load_existing_study(storage, name)
        from autotune.views import REPORT_NAME, annotate, write_report

        annotate(loaded, open_storage(storage))
        if export_dir is None:
            return []
        path = write_report(loaded, Path(export_dir) / REPORT_NAME)
    except Exception as exc:  # noqa: BLE001 - the run's result is exported; say what failed
        return [f"warning: report and dashboard notes not written: {exc}"]
    return [f"report: {path} (autotune dashboard --study {name} serves the study)"]


def previous_best(storage: str, name: str) -> Best | None:
    """The best of a study this run continues (for the live view), if it can be read."""
    from autotune.study import best, load_existing_study

    try:
        return best.of_study(load_existing_study(storage, name))
    except AutotuneError:
        return None
