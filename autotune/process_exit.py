"""How autotune's own processes end: as a normal exit, less the interpreter's teardown.

A process that imported torch, DeepSpeed and transformers spends seconds of CPU at exit
freeing every module, tensor and C++ static (benchmarks/RESULTS.md, "Start and end of a run
and of a probe launch"), after its work is done and while its parent waits; a study launches
many.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading


def exit_without_teardown(code: int) -> None:
    """Exit with ``code`` as the interpreter would (non-daemon threads joined, exit handlers
    run, output flushed), then end the process without freeing what it holds."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
