"""``python -m runner.rank.loopback_launch ARGS``: ``accelerate launch ARGS`` for a one-machine run of several
processes, with the rendezvous store listening on the loopback address only.

torchrun's agent (which ``accelerate launch`` runs in-process for more than one process) hosts a TCPStore
on the rendezvous port, and TCPStore's server binds every interface whatever host name it is given, so a
one-machine run would expose that port to the network. TCPStore also takes an already-listening socket
(``master_listen_fd``): this wrapper binds one to 127.0.0.1 on the run's port and hands it to the store
the agent creates. Everything else is accelerate's launch, unchanged (the ranks are clients of the store;
gloo binds to ``GLOO_SOCKET_IFNAME=lo``). Should torch's internals differ, the wrapper leaves them alone
and the run goes on as plain ``accelerate launch``.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

LOOPBACK = "127.0.0.1"
_listeners: list[socket.socket] = []  # kept open for the life of the launcher


def _loopback_listener(port: int) -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, port))
    sock.listen(512)
    _listeners.append(sock)
    return sock.fileno()


def install() -> bool:
    """Make the static rendezvous host its store on a loopback socket; False when torch has no such hook."""
    try:
        from torch.distributed.elastic.rendezvous import static_tcp_rendezvous as static
    except ImportError:
        return False
    original = getattr(static, "TCPStore", None)
    if original is None:
        return False

    def loopback_store(host_name: str, port: int, *args: Any, **kwargs: Any) -> Any:
        is_master = kwargs.get("is_master", args[1] if len(args) > 1 else False)
        if is_master and host_name in (LOOPBACK, "localhost") and "master_listen_fd" not in kwargs:
            kwargs["master_listen_fd"] = _loopback_listener(int(port))
        return original(host_name, port, *args, **kwargs)

    setattr(static, "TCPStore", loopback_store)  # noqa: B010 (a module attribute torch does not export)
    return True


def main() -> None:
    install()
    from accelerate.commands.launch import launch_command, launch_command_parser

    parser = launch_command_parser()
    launch_command(parser.parse_args(sys.argv[1:]))


if __name__ == "__main__":
    main()
