"""One rank of a script probe: ``python -m autotune.probe.script_rank --spec spec.json`` (or
``--serve INBOX``, warm) under torchrun. The user's training script, unedited, is the probe;
what one run of it measures is :class:`~autotune.probe._script_probe.ScriptProbe`.

The rank patches ``deepspeed.initialize`` (accelerate and the Hugging Face Trainer look it up
at call time, so they get the patch too), then runs the script with :mod:`runpy` and the
candidate's arguments. When the script calls ``deepspeed.initialize``:

- the config it passes (``config=``/``config_params=``, a dict, a path or base64, or
  ``args.deepspeed_config``) is the base, and the candidate's tuned keys are laid over it
  (the backend's ``render_config``, the only code that spells them): every
  other key of the user's config (optimizer, scheduler, clipping, offload paths) is kept;
- the model it hands over is described in the report (:class:`ModelInfo`), for the ZeRO
  formulas; on CPU ranks the tensor tracker (:mod:`autotune.probe._memtrack`) starts from the
  model's tensors and enforces the memory limit as a device allocator would (on CUDA ranks
  the allocator's limit and peak statistics start with the rank, before the script runs);
- the engine module's forwards during warm-up give the activation bytes (the tracker's live
  bytes on CPU, the allocator's allocated bytes on CUDA, before and after);
- the engine's ``step`` is wrapped: an optimizer step ends where
  ``engine.is_gradient_accumulation_boundary()`` held before ``step()``, and its time is
  from the end of the previous one (the script's data loading, forward and backward of
  every micro-batch, the step). Each step's time is all-reduced (MAX), so every rank sees
  the same series and stops after the same step; warm-up, adaptive timing and early stop
  follow :mod:`autotune.timing`, as in built-in probes.

Once the probe has its steps, the rank writes its :class:`~autotune.protocol.RankReport`,
meets its peers at a barrier, destroys the process group and exits 0 (no need to finish an
epoch). A script that raises, exits or ends too soon gets a report saying so.

A loss run (``ProbeSpec.loss_run``, for ``autotune verify``) records each optimizer
step's loss and samples instead of timing it, and ends after its steps
(:mod:`autotune.probe._script_loss_run`).

**Warm ranks** (``--serve INBOX``, a warm worker's group): the rank runs the script once per
posted job, in the same process. The interpreter, the script's imports (its own modules
too: only ``__main__`` runs again), the process group and DeepSpeed's ops are paid once;
each candidate pays the script's ``__main__`` (its data and model) and its engine. A probe
that has its steps writes its report and unwinds the script with :class:`ProbeDone` (a
``BaseException``: the script's ``except Exception`` does not swallow it); the rank then
drops the engine, restores ``deepspeed.initialize``, collects and empties caches, and at the
next job checks that nothing of the earlier candidate is still allocated (``unclean``: the
group restarts, as for built-in warm ranks). The process group the first run made is kept:
``torch.distributed.init_process_group`` and ``destroy_process_group`` become no-ops while
it exists (DeepSpeed's ``init_distributed`` already is). A failure, or a script that ends
before the probe's steps, leaves as a cold rank does; the worker then probes that job again
in a cold launch, and where the cold one measures, the rest of the study's script probes
are cold too (:mod:`autotune.execution._worker`), so a script that cannot run twice in one
process is never measured wrong.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.probe._peak_guard import peak_counters_kept
from autotune.probe._rank_process import (
    device_of,
    end_children,
    leave_now,
    leave_process_group,
    output_to,
    posted_jobs,
    quiet_libraries,
    start_host_peak,
    versions,
)
from autotune.probe._script_probe import ProbeDone, ScriptMissing, ScriptProbe
from autotune.protocol import NODE_ENV, ProbeSpec, RankReport


def _exit_code(exc: SystemExit) -> int:
    return exc.code if isinstance(exc.code, int) else int(exc.code is not None)


def run(spec_path: Path, started: float, *, warm: bool = False) -> None:
    """Run the script of ``spec_path`` as this rank's probe; never returns, unless ``warm``
    and the probe has its steps (then its report is written and the script unwound).
    DeepSpeed's resets of the peak counters do nothing while it runs: the peak counts from
    the rank's start (:mod:`autotune.probe._peak_guard`)."""
    start_host_peak()  # the script's host memory from before its first allocation
    spec = ProbeSpec.model_validate_json(spec_path.read_text(encoding="utf-8"))
    probe = ScriptProbe(spec, spec_path, started, warm=warm)
    with contextlib.ExitStack() as guards:
        _run_script(probe, guards)


def _run_script(probe: ScriptProbe, guards: contextlib.ExitStack) -> None:
    """The script's run, every failure (the peak guard's set-up included) a report."""
    import torch

    spec, script = probe.spec, probe.script
    try:
        guards.enter_context(peak_counters_kept())
        quiet_libraries()
        probe.device = device_of(spec)
        probe.start_cuda_memory()
        torch.set_float32_matmul_precision(spec.float32_matmul_precision)
        probe.report.versions = versions(probe.device)
        probe.report.threads = torch.get_num_threads()
        probe.install()
        if probe.loss_run is not None:
            probe.loss_run.seed()
        _check_script_here(script.path)
        sys.argv = [script.path, *script.argv]
        folder = str(Path(script.path).parent)
        if sys.path[:1] != [folder]:
            sys.path.insert(0, folder)
        runpy.run_path(script.path, run_name="__main__")
        code = 0
    except ProbeDone:
        probe.uninstall()
        return
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a report
        probe.fail(exc)
        raise AssertionError("unreachable") from None
    probe.ended(code)


def _check_script_here(path: str) -> None:
    """A rank on a cluster node runs the script at the driver's path: say so where it is not."""
    if not os.path.isfile(path):
        import socket

        node = os.environ.get(NODE_ENV) or socket.gethostname()
        raise ScriptMissing(
            f"{path} is not on {node}: every node runs the script at the driver's path; put "
            "it there (a shared filesystem, or a copy at the same path)"
        )


def serve(inbox: Path) -> None:
    """Probe the jobs posted to ``inbox`` in order, the script run once per job in this
    process (module docstring, "Warm ranks"), until a job says stop."""
    from autotune.probe import _rank_memory as rank_memory

    restore = _keep_process_group()
    try:
        for number, spec_path in posted_jobs(inbox):
            started = time.perf_counter()
            spec = ProbeSpec.model_validate_json(spec_path.read_text(encoding="utf-8"))
            with output_to(spec_path.parent / "probe.log"):
                if number == 1:  # what this process holds before any script run: the baseline
                    rank_memory.leaked_bytes(device_of(spec))
                else:
                    _refuse_if_unclean(spec, spec_path, started)
                run(spec_path, started, warm=True)
                end_children()  # what the script started (data-loading workers) ends with it
                rank_memory.release(spec.accelerator)
    finally:
        restore()


def _refuse_if_unclean(spec: ProbeSpec, spec_path: Path, started: float) -> None:
    """An earlier candidate's memory still allocated (beyond the tolerance, on any rank):
    report ``unclean`` and leave, so that the worker probes this job in a fresh group."""
    from autotune.probe import _rank_memory as rank_memory

    device = device_of(spec)
    report = RankReport(rank=int(os.environ.get("RANK", "0")), status="ok", pid=os.getpid())
    report.leaked_bytes = rank_memory.leaked_bytes(device)
    tolerance = rank_memory.leak_tolerance_bytes(spec.vram_limit_bytes)
    if report.leaked_bytes > tolerance:
        report.status = "unclean"
        report.error = (
            f"{report.leaked_bytes} bytes of earlier candidates still allocated at the start "
            f"(more than {tolerance}); the ranks must restart"
        )
        leave_now(report, spec_path, started)


def _keep_process_group() -> Callable[[], None]:
    """The process group the script's first run makes serves every later run in this rank:
    while it exists a second ``init_process_group`` (which would raise) does nothing, and so
    does the script's own ``destroy_process_group()`` of it (in a ``finally`` that the end of
    a probe runs: the next run would make a new group that DeepSpeed's cached groups do not
    belong to). Patched before the first run; returns what puts both back."""
    import torch.distributed as dist

    init, destroy = dist.init_process_group, dist.destroy_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if not dist.is_initialized():
            init(*args, **kwargs)

    def destroy_process_group(group: Any = None) -> None:
        if group is not None:
            destroy(group)

    def restore() -> None:
        dist.init_process_group, dist.destroy_process_group = init, destroy

    dist.init_process_group = init_process_group
    dist.destroy_process_group = destroy_process_group
    return restore


def main(argv: list[str] | None = None) -> int:
    from autotune.probe._rank_process import die_with_parent

    started = time.perf_counter()
    die_with_parent()  # torchrun killed (its driver died): this rank goes too, even if hung
    # Python 3.10 puts the working folder first on the path for -m (3.11+: PYTHONSAFEPATH):
    # the script's folder goes there instead, as `python train.py` has it
    sys.path[:] = [entry for entry in sys.path if entry not in ("", os.getcwd())]
    from autotune.backends import prepare_rank_process

    prepare_rank_process()
    parser = argparse.ArgumentParser(
        prog="python -m autotune.probe.script_rank", description=__doc__
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--spec", type=Path, help="ProbeSpec JSON with a script.")
    source.add_argument("--serve", type=Path, help="Inbox folder of a warm worker.")
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve)
        leave_process_group()
        end_children()
        return 0
    run(args.spec, started)
    return 0


if __name__ == "__main__":
    from autotune.process_exit import exit_without_teardown

    exit_without_teardown(main())
