"""The ``autotune`` command line: parse flags, build settings, call the library, print.

This is the only place that catches :class:`AutotuneError`: it prints the message on one
line (the traceback too with ``--debug``) and exits with code 2. Heavy libraries (torch,
deepspeed, ray) are imported inside the commands, never at import of this module.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, get_args

import typer
from rich.console import Console

from autotune.cli import _study_commands as study_commands
from autotune.cli._study_commands import after_run, previous_best
from autotune.errors import AutotuneError, NoResultError
from autotune.units import format_bytes

if TYPE_CHECKING:
    from collections.abc import Iterator

    from autotune.events import Emit, Event
    from autotune.run import ResolvedRun, RunSummary

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

EXIT_INTERRUPTED = 130


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
) -> None:
    """Find the fastest DeepSpeed configuration that fits your GPU memory, by search."""


def run(**given: Any) -> None:
    """Search the space for the fastest configuration that fits, by real probes.

    An existing study continues: flags not given are taken from the study, the budget is
    what the study has left, and interrupted probes are run again once."""
    import time
    from pathlib import Path

    from autotune.cli._flags import RunFlags
    from autotune.cli._project import layer
    from autotune.run import Tuner, resolve_run
    from autotune.study import stored_run_flags

    started_s = time.monotonic()  # the budget counts the whole command (bar an op build)
    given, project = layer(given, Path.cwd())  # the folder's autotune.yaml, under the flags
    typed = RunFlags.resolve(given, {})  # every given flag is checked before a file is opened
    name = typed.study_name()
    stored = stored_run_flags(typed.storage, name)
    flags = RunFlags.resolve(given, stored)
    resolved = resolve_run(flags.settings())
    if stored:
        inherited = sorted(
            k
            for k, v in flags.stored().items()
            if not k.startswith("_") and not given.get(k) and stored.get(k) == v and v
        )
        console.print(f"continuing study {name!r} with its flags ({', '.join(inherited)})")
    if project:
        console.print(f"project file: {project} (flags given here win over it)")
    _print_resolved_run(resolved)
    with _renderer(
        quiet=flags.quiet, continued=bool(stored), storage=flags.storage, name=name
    ) as emit:
        tuner = Tuner(
            resolved,
            emit=emit,
            fault=flags.inject_fault,
            run_flags=flags.stored(),
            started_s=started_s,
            on_second_interrupt=_exit_at_once,
        )
        summary = tuner.run()
    for text in after_run(flags.storage, name, summary.export_dir):
        console.print(text)
    _print_outcome(summary, resolved)


def _exit_at_once() -> None:
    """A second Ctrl-C during a run: kill every probe group and leave at once, without the
    orderly stop; SQLite/PostgreSQL roll back an open transaction."""
    from autotune.execution import kill_all_groups

    kill_all_groups()
    if sys.stdout.isatty():
        os.write(1, b"\x1b[?25h")  # the live view hid the cursor: give it back
    os.write(2, b"autotune: interrupted twice: exiting now, probes killed\n")
    os._exit(130)


@contextmanager
def _renderer(*, quiet: bool, continued: bool, storage: str, name: str) -> Iterator[Emit]:
    """The live view on a terminal; plain lines in a pipe, in CI, or with --quiet."""
    if quiet or not console.is_terminal or console.is_dumb_terminal:
        yield _print_event
        return
    from autotune.cli._live import LiveView

    with LiveView(console, previous=previous_best(storage, name) if continued else None) as view:
        yield view


def _run_parameters() -> list[inspect.Parameter]:
    """``run``'s options, one per :class:`~autotune.cli._flags.RunFlags` field: its description
    is the help and its default the one shown (each option itself defaults to None, so that
    what was typed is told apart from what a continued study stored)."""
    from autotune.cli._flags import RunFlags

    parameters = []
    for name, field in RunFlags.model_fields.items():
        flag = "--" + name.replace("_", "-")
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        hidden = bool(extra.get("hidden"))
        annotation: Any
        default: Any = None
        if extra.get("positional"):  # what follows `--`: the script's own arguments
            annotation = Annotated[
                list[str] | None, typer.Argument(help=field.description, show_default=False)
            ]
        elif field.annotation == list[str]:  # a repeatable option
            option = typer.Option(flag, help=field.description, hidden=hidden)
            annotation = Annotated[list[str] | None, option]
        elif field.annotation is bool:
            annotation = Annotated[bool, typer.Option(flag, help=field.description, hidden=hidden)]
            default = False
        else:
            shown = "" if field.default is None else f" [default: {field.default}]"
            kind = {int: int, int | None: int, float: float, float | None: float}.get(
                field.annotation, str
            )
            # a value that may be left out (--verify, --verify strict): cli._flags
            # .with_optional_values joins it to the flag before parsing
            metavar = None
            if "optional_value" in extra:
                others = [v for v in get_args(field.annotation) if v != extra["optional_value"]]
                metavar = "[" + "|".join(others) + "]"
            option = typer.Option(
                flag, help=f"{field.description}{shown}", hidden=hidden, metavar=metavar
            )
            annotation = Annotated[kind | None, option]
        parameters.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
    return parameters


run.__signature__ = inspect.Signature(_run_parameters())  # type: ignore[attr-defined]
app.command("run")(run)


@app.command("init")
def init(
    script: Annotated[str, typer.Argument(help="Your training script, e.g. train.py.")],
    script_args: Annotated[
        list[str] | None, typer.Argument(help="Its arguments, after `--`.", show_default=False)
    ] = None,
    gpus: Annotated[int, typer.Option(help="Devices the study may use.", min=1)] = 1,
) -> None:
    """Write an autotune.yaml for SCRIPT and its arguments, so that `autotune run` alone
    tunes it (e.g. autotune init train.py -- --deepspeed ds_config.json)."""
    from pathlib import Path

    from autotune.cli._project import init as write_project

    path = write_project(script, list(script_args or []), gpus=gpus, folder=Path.cwd())
    console.print(f"wrote {path}; edit it, then: autotune run")


@app.command("build-ops")
def build_ops() -> None:
    """Build DeepSpeed's ops for every offload target on this node (cached from then on).

    A probe builds what it needs on first use; this builds them all up front, for example
    once on each node of a cluster."""
    from autotune.backends.deepspeed import ensure_deepspeed_ops, torch_extensions_dir
    from autotune.cli._render import line
    from autotune.hardware import detect

    report = ensure_deepspeed_ops(
        detect(), offload_targets={"cpu", "nvme"}, emit=lambda event: console.print(line(event))
    )
    console.print(
        f"DeepSpeed ops in {torch_extensions_dir()}: built {', '.join(report.built) or 'none'}, "
        f"cached {', '.join(report.cached) or 'none'} ({report.seconds:.0f} s)"
    )


def _print_resolved_run(resolved: ResolvedRun) -> None:
    from autotune.backends import cpu_rank_libraries

    libraries = cpu_rank_libraries(resolved.space.backends)
    console.print(resolved.hardware.describe(resolved.settings.limits.gpus, libraries))
    batch = resolved.config.global_batch or f"auto (up to {resolved.config.max_global_batch})"
    console.print(
        f"workload {resolved.workload.describe()}; global batch {batch}, "
        f"{resolved.config.ranks_text} rank(s) per probe, memory limit "
        f"{format_bytes(resolved.config.vram_limit_bytes)} per rank"
    )
    for note in resolved.notes:
        console.print(f"note: {note}")


def _print_event(event: Event) -> None:
    from autotune.cli._render import line

    text = line(event)
    if text is not None:
        console.print(text)


def _print_outcome(summary: RunSummary, resolved: ResolvedRun) -> None:
    """The run's last lines; exit 130 when interrupted, an error when nothing is exported."""
    from autotune.cli._render import stop_reason
    from autotune.run import continue_command

    stop = stop_reason(summary.stop, continue_command(resolved)) if summary.stop else "done"
    console.print(
        f"stopped: {stop}; {summary.probes} probe(s) in {summary.elapsed_s:.0f} s, "
        f"{summary.pruned + summary.screened} candidate(s) ruled out without a probe, "
        f"{summary.duplicates} duplicate proposal(s) skipped"
    )
    if summary.interrupted:
        console.print(
            f"interrupted: {len(summary.interrupted)} running probe(s) stopped and recorded as "
            f"interrupted (probed again on continue); continue with: {continue_command(resolved)}"
        )
    best, record = summary.best, summary.best_record
    if best is not None and record is not None and summary.export_dir:
        estimate = "confirmed estimate" if best.confirmed else "measured"
        tokens_per_s = best.samples_per_s * record.tokens_per_s / max(record.samples_per_s, 1e-9)
        tokens = (
            "" if record.tokens_per_s == record.samples_per_s else f"{tokens_per_s:.0f} tokens/s, "
        )
        console.print(
            f"best: trial {best.trial} {best.label}: {best.samples_per_s:.1f} samples/s "
            f"({estimate}), {tokens}peak "
            f"{format_bytes(record.peak_bytes)} of {format_bytes(summary.vram_limit_bytes)} "
            "per rank"
        )
        goal = resolved.goal
        if goal.says_more_than_speed:
            outcome = goal.outcome(best.samples_per_s, best.gpus)
            console.print(
                f"objective: {goal.describe()}: the {goal.noun(best.samples_per_s)} on "
                f"{best.gpus} GPU(s)" + (f", {outcome}" if outcome else "")
            )
        console.print(
            f"exported: {summary.exported_config} (with launch.sh and summary.md beside it)"
        )
    if summary.stop is not None and summary.stop.kind == "interrupted":
        raise typer.Exit(EXIT_INTERRUPTED)
    if best is None:
        raise NoResultError(_why_nothing(summary, resolved))


def _why_nothing(summary: RunSummary, resolved: ResolvedRun) -> str:
    """One line: why the run has nothing to export, and what to do."""
    from autotune.run import continue_command

    more = f"{continue_command(resolved)} --budget LONGER"
    if summary.probes == 0:
        return (
            f"nothing exported: no probe ran within the budget; give the study more time ({more})"
        )
    return (
        f"nothing exported: none of the {summary.probes} probe(s) measured a configuration "
        f"within the {format_bytes(summary.vram_limit_bytes)} limit per rank and --host-ram "
        f"per node (autotune status --study "
        f"{resolved.study_name} shows why each failed); fix the cause or give it more time ({more})"
    )


for _name, _command in study_commands.COMMANDS.items():
    app.command(_name)(_command)


def main(argv: list[str] | None = None) -> int:
    """Entry point: one line per error, exit code 2; tracebacks only with --debug."""
    from autotune.cli._flags import with_optional_values

    args = with_optional_values(sys.argv[1:] if argv is None else argv)
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


def entry() -> None:
    """The ``autotune`` command: :func:`main`, ended without the interpreter's teardown."""
    from autotune.process_exit import exit_without_teardown

    exit_without_teardown(main())


if __name__ == "__main__":
    entry()
