"""The command line: `autotune run` and the commands that look at a study; flags, the project
file, and how events are rendered (plain lines, the live view). The only place that catches
:class:`autotune.errors.AutotuneError`."""

from autotune.cli._app import app, entry, main

__all__ = ["app", "entry", "main"]
