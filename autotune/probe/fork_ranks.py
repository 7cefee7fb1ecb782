"""CPU probe ranks forked from a launcher that has imported their code.

A CPU probe rank started as its own program spends seconds of CPU importing torch,
DeepSpeed, transformers and the model's code before it probes anything, and every rank of
every launch pays it (benchmarks/RESULTS.md, "A probe launch: ranks forked after their
imports"). ``python -m autotune.probe.fork_ranks --nproc-per-node N --workload REF -- ARGS`` imports
that code once and forks the N ranks of ``python -m autotune.probe.rank ARGS`` from it
(``torch.multiprocessing``, start method ``fork``): they begin with everything imported.

The rest is what torchrun does for a single machine: the launcher hosts the rendezvous
store on loopback and every rank is its client (``TORCHELASTIC_USE_AGENT_STORE``, as under
torchrun and on a Ray cluster, :mod:`autotune.execution._spanning_slot`), each rank gets ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``, gloo's sockets stay on
loopback (:mod:`autotune.probe.loopback_run`), and when a rank fails the others are stopped and the
launcher raises torch's ``ChildFailedError`` naming every rank that failed with its exit
code or signal: the report torchrun prints, read by :mod:`autotune.protocol`. (torchrun's
own agent forks ranks too, but reports only the first failure it polls: often the peer
that failed on the broken connection, not the rank that was killed.)

The launcher only imports, with one OpenMP and MKL thread: a child inherits none of its
parent's threads, so a team of OpenMP threads made in the parent (by an operation an import
might run) would hang the child's first parallel region (GNU OpenMP has no fork handler).
Each rank then sets the threads of the launch (``torch.set_num_threads``, its
``OMP_NUM_THREADS``). At the fork the one other thread is the store's, which the ranks
reach as clients. Only CPU probes are forked: DeepSpeed's accelerator detection touches
CUDA at import, and a CUDA process must not fork. A user's script
(:mod:`autotune.probe.script_rank`) runs under torchrun as its own program, and a workload of
user code is imported by the ranks, not here (what it does at import is unknown).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
import traceback
from typing import Any

from autotune.probe.loopback_run import bound_listener, loopback_interface

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
LOOPBACK = "127.0.0.1"
NOT_AVAILABLE = "<N/A>"  # a failure without an error file, as torchrun reports it
STOP_GRACE_S = 30.0  # torchrun's wait for its ranks to exit once it has SIGTERMed them


def import_rank_code(workload_ref: str | None) -> None:
    """Import what every CPU probe rank imports: torch, DeepSpeed, the probe, and the
    model code of a built-in or ``hf:`` workload. A workload whose code cannot be imported
    here is left to the ranks, which report why."""
    # DeepSpeed (DS_ACCELERATOR=cpu is in the environment), with the Muon optimizer its
    # engine imports at the first ZeRO optimizer (its sanity check): torch's compiler stack,
    # which Muon only decorates with at import, would otherwise be imported in every rank
    import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401
    import torch.utils.cpp_extension  # noqa: F401 - every op load

    import autotune.probe.rank  # noqa: F401
    from autotune.workloads import HF_PREFIX, WORKLOADS, get_workload

    if workload_ref and (workload_ref in WORKLOADS or workload_ref.startswith(HF_PREFIX)):
        with contextlib.suppress(Exception):
            get_workload(workload_ref).import_model_code()
    from autotune.backends.deepspeed import PRELOAD_OPS_VARIABLE, preload_built_ops

    preload_built_ops(filter(None, os.environ.get(PRELOAD_OPS_VARIABLE, "").split(",")))


def _rank(local_rank: int, world_size: int, port: int, probe_args: list[str]) -> None:
    """One forked rank: ``python -m autotune.probe.rank PROBE_ARGS`` less the imports.

    The launcher's signal handlers are not the rank's: a rank told to stop ends at once, as
    a rank of its own program would. On success the function returns and torch's worker
    wrapper exits without interpreter teardown; a failure prints its traceback and exits 1.
    """
    for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.update(
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",  # the launcher hosts the store
    )
    try:
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        from autotune.probe import rank as probe

        sys.argv = [probe.__file__, *probe_args]
        probe.main(probe_args)
    except BaseException:  # noqa: BLE001 - the rank's own failure, printed as its program would
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def _failure(context: object, first: int) -> Exception:
    """torch's ChildFailedError for every rank that exited non-zero, ``first`` first."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    processes = context.processes  # type: ignore[attr-defined]
    order = [first] + [i for i in range(len(processes)) if i != first]
    failures = {
        i: ProcessFailure(i, processes[i].pid, processes[i].exitcode, NOT_AVAILABLE)
        for i in order
        if processes[i].exitcode not in (0, None)
    }
    return ChildFailedError(name="autotune.probe.rank", failures=failures)


def launch(world_size: int, workload_ref: str | None, probe_args: list[str]) -> None:
    """Import the ranks' code, fork ``world_size`` ranks and wait for them all; raise
    ChildFailedError when one fails (after stopping the others)."""
    threads = {name: os.environ.get(name, "1") for name in THREAD_VARIABLES}
    os.environ.update(dict.fromkeys(THREAD_VARIABLES, "1"))  # before torch is imported
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    interface = loopback_interface()
    if interface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    import_rank_code(workload_ref)
    os.environ.update(threads)  # what the ranks inherit
    from datetime import timedelta

    import torch.distributed as dist
    import torch.multiprocessing as mp

    listener = bound_listener(LOOPBACK, 0)
    port = listener.getsockname()[1]
    store = dist.TCPStore(  # noqa: F841 - serves the ranks' rendezvous while they run
        LOOPBACK,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(minutes=5),
        master_listen_fd=listener.detach(),
    )
    context = mp.start_processes(
        _rank,
        args=(world_size, port, probe_args),
        nprocs=world_size,
        join=False,
        start_method="fork",
    )
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, _raise_stop)  # after the fork: the ranks keep the default
    try:
        while not context.join():  # one rank's exit at a time; a failure stops the rest
            pass
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as exc:
        raise _failure(context, exc.error_index) from None
    except _Stop as stop:
        _end(context.processes)
        sys.exit(128 + stop.signal_number)


class _Stop(Exception):
    """The launcher was told to stop (SIGTERM, SIGHUP)."""

    def __init__(self, signal_number: int) -> None:
        super().__init__(signal_number)
        self.signal_number = signal_number


def _raise_stop(signal_number: int, frame: object) -> None:
    raise _Stop(signal_number)


def _end(processes: list[Any]) -> None:
    """Stop the ranks as torchrun does when it is stopped: SIGTERM, up to ``STOP_GRACE_S``
    to exit, then SIGKILL; the launcher exits after its ranks."""
    for process in processes:
        if process.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m autotune.probe.fork_ranks", description=__doc__
    )
    parser.add_argument("--nproc-per-node", type=int, required=True, help="Ranks to fork.")
    parser.add_argument("--workload", help="The probes' workload, whose code is imported.")
    parser.add_argument("probe_args", nargs=argparse.REMAINDER, help="-- autotune.probe's.")
    args = parser.parse_args(argv)
    probe_args = args.probe_args[1:] if args.probe_args[:1] == ["--"] else args.probe_args
    launch(args.nproc_per_node, args.workload, probe_args)


if __name__ == "__main__":
    main()  # raises where a rank failed (torch's failure report)
    from autotune.process_exit import exit_without_teardown

    exit_without_teardown(0)
