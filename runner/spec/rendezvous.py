"""Where the machines of a multi-node run meet: the rendezvous settings, checked, and what they change in
the launch (pure: no I/O; :mod:`runner.spec.launch` applies them, :mod:`runner.nodes.agent` runs the node agent).

Two ways to meet, both through ``accelerate launch`` (torchrun underneath):

- **static**: every node is told the number of machines, its own node rank and the main node's address and
  port (``--nnodes 2 --node-rank K --main-addr A``); node rank 0 hosts the rendezvous store.
- **c10d**: every node runs the same command with a rendezvous endpoint (``--rdzv-endpoint HOST:PORT``);
  torch assigns the node ranks by arrival, so nothing here assumes them: the ranks read theirs from
  the environment (``GROUP_RANK``, ``RANK``) and the agent records them once they started.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass

DEFAULT_PORT = 29500
"""torchrun's default rendezvous port, used when none is given."""


class NodesError(ValueError):
    """A multi-node setting that cannot work, phrased as one line naming the field."""


@dataclass(frozen=True)
class NodeSpec:
    """The rendezvous of one node of a multi-node run.

    Attributes:
        nnodes: machines in the run (2 or more).
        node_rank: this machine's node rank (static); None under c10d (assigned at the rendezvous).
        main_addr: the main node's address (static) or the rendezvous host (c10d).
        main_port: its port.
        backend: ``"static"`` or ``"c10d"``.
        run_key: what the node agents share to find the run's row in the store.
    """

    nnodes: int
    node_rank: int | None
    main_addr: str
    main_port: int
    backend: str
    run_key: str

    @property
    def loopback(self) -> bool:
        """Every node on this machine (tests, demos): collectives stay on the loopback interface."""
        return is_loopback(self.main_addr)


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` names this machine's loopback interface."""
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def split_endpoint(endpoint: str, field: str = "--rdzv-endpoint") -> tuple[str, int]:
    """``HOST:PORT`` (port defaults to 29500); NodesError naming ``field`` when malformed."""
    host, sep, port_text = endpoint.rpartition(":")
    if not sep:
        host, port_text = endpoint, str(DEFAULT_PORT)
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise NodesError(f"{field}: expected HOST:PORT, got {endpoint!r}")
    return host, int(port_text)


def node_spec(nnodes: int, node_rank: int | None, main_addr: str | None, main_port: int | None,
              rdzv_endpoint: str | None, run_key: str | None, recipe_name: str) -> NodeSpec:
    """Check the multi-node settings and make the node's :class:`NodeSpec`.

    The run key, when not given, is derived from what every node of the launch is given alike (the
    rendezvous address and port and the recipe's name), so the same command on each node finds one run.

    Raises:
        NodesError: one line naming the field.
    """
    if nnodes < 2 and rdzv_endpoint is None:  # (a one-node SLURM job meets at its c10d endpoint all the same)
        raise NodesError(f"--nnodes: a multi-node run needs 2 or more machines, got {nnodes}")
    if rdzv_endpoint is not None:
        if main_addr is not None:
            raise NodesError("--main-addr: give either --main-addr (static) or --rdzv-endpoint (c10d), not both")
        host, port = split_endpoint(rdzv_endpoint)
        if node_rank is not None:
            raise NodesError("--node-rank: c10d assigns node ranks at the rendezvous; leave it out with "
                             "--rdzv-endpoint")
        backend = "c10d"
    else:
        if main_addr is None:
            raise NodesError("--main-addr: a multi-node run needs the main node's address (or --rdzv-endpoint)")
        if node_rank is None:
            raise NodesError("--node-rank: this machine's node rank (0 to nnodes-1) is needed with --main-addr")
        if not 0 <= node_rank < nnodes:
            raise NodesError(f"--node-rank: {node_rank} is not in 0..{nnodes - 1}")
        host, port, backend = main_addr, main_port or DEFAULT_PORT, "static"
    if not 0 < port < 65536:
        raise NodesError(f"--main-port: {port} is not a TCP port")
    key = run_key or derived_key(backend, host, port, recipe_name)
    if len(key) > 200:
        raise NodesError("--run-key: at most 200 characters")
    return NodeSpec(nnodes=nnodes, node_rank=node_rank, main_addr=host, main_port=port, backend=backend,
                    run_key=key)


def derived_key(backend: str, host: str, port: int, recipe_name: str) -> str:
    """The run key every node of one launch derives alike (a finished run's key is reused by the next)."""
    digest = hashlib.sha256(f"{backend}|{host}|{port}|{recipe_name}".encode()).hexdigest()[:12]
    return f"{backend}-{host}-{port}-{digest}"


def accelerate_fields(spec: NodeSpec, nproc_per_node: int) -> dict[str, object]:
    """The accelerate config keys a multi-node launch sets (the rest is the one-machine config).

    ``num_processes`` is the whole world (accelerate divides it by ``num_machines``). Static rendezvous
    uses ``same_network`` (torchrun's ``--master_addr/--master_port --node_rank``); c10d names the
    endpoint and lets torch assign node ranks.
    """
    if spec.nnodes == 1:  # one node of a SLURM job: accelerate's one-machine launch, at the given address
        return {"main_process_ip": spec.main_addr, "main_process_port": spec.main_port}
    return {
        "num_machines": spec.nnodes,
        # c10d ignores it (torchrun assigns node ranks); accelerate checks the port is free on machine rank 0
        # only, which on one machine would see the first node's c10d store: loopback nodes say 1.
        "machine_rank": spec.node_rank if spec.node_rank is not None else (1 if spec.loopback else 0),
        "num_processes": spec.nnodes * nproc_per_node,
        "main_process_ip": spec.main_addr,
        "main_process_port": spec.main_port,
        "rdzv_backend": spec.backend,
        "same_network": spec.backend == "static",
    }
