"""torchrun for a single machine whose every socket listens on loopback only.

``python -m autotune.probe.loopback_run --standalone ...`` is torchrun (``torch.distributed.run``)
with two changes, so that nothing a probe opens can be reached from the network (whoever
reaches a rendezvous store or a rank can disturb or inject into the collectives):

- torch's ``TCPStore`` server binds the any-address (``::`` or ``0.0.0.0``) whatever host it
  is given; the only way to choose its address is a socket bound beforehand
  (``master_listen_fd``). A store that hosts a loopback endpoint (its clients are told
  ``localhost`` or ``127.0.0.1``) gets a socket bound to 127.0.0.1 here: torchrun's
  rendezvous store and the store it shares with the ranks (``--standalone`` gets
  ``--local-addr 127.0.0.1``, so the ranks are told ``MASTER_ADDR=127.0.0.1``).
- gloo binds its pair sockets to the address the host name resolves to, NCCL its bootstrap
  sockets to the first non-loopback interface: ``GLOO_SOCKET_IFNAME`` and
  ``NCCL_SOCKET_IFNAME`` name the loopback interface instead, unless the user set them.
  One machine's collectives never leave it (NCCL's data goes over NVLink, PCIe or shared
  memory between GPUs of one host either way).
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def loopback_interface() -> str | None:
    """The name of the interface that holds 127.0.0.1 (``lo`` on Linux), if any."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return None


def bound_listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one), for a TCPStore server
    to adopt (``master_listen_fd``)."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
        listener.listen(1024)
    except OSError:
        listener.close()
        raise
    return listener


def _loopback_store_factory(tcp_store: Any) -> Any:
    """Wrap torch's ``TCPStore`` so that a server for a loopback host listens on 127.0.0.1."""

    def create(host_name: str, port: int, *args: Any, **kwargs: Any) -> Any:
        names = ("world_size", "is_master", "timeout", "wait_for_workers", "multi_tenant")
        kwargs.update(zip(names, args, strict=False))
        if (
            kwargs.get("is_master")
            and kwargs.get("master_listen_fd") is None
            and host_name in LOOPBACK_HOSTS
        ):
            listener = bound_listener("::1" if host_name == "::1" else "127.0.0.1", port)
            port = listener.getsockname()[1]
            kwargs["master_listen_fd"] = listener.detach()  # the store owns it from here
        return tcp_store(host_name, port, **kwargs)

    return create


def main(argv: list[str] | None = None) -> None:
    import torch.distributed as dist

    # Before torch.distributed.run imports the rendezvous modules (they bind the name then).
    dist.TCPStore = _loopback_store_factory(dist.TCPStore)  # type: ignore[misc]
    interface = loopback_interface()
    if interface is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    from torch.distributed.run import main as torchrun_main

    args = list(argv if argv is not None else sys.argv[1:])
    if "--standalone" in args and not any(
        a.startswith(("--local-addr", "--local_addr")) for a in args
    ):
        args.insert(0, "--local-addr=127.0.0.1")  # what the ranks are told: MASTER_ADDR
    torchrun_main(args)


if __name__ == "__main__":
    main()  # raises where a rank failed (torchrun's exit code and summary)
    from autotune.process_exit import exit_without_teardown

    exit_without_teardown(0)
