"""`python -m workbench.trainer.parallel.launch TORCHRUN_ARGS...`: torchrun, with a stop that is clean.

torchrun's agent answers SIGTERM by raising an exception: it forwards the signal to its
workers, waits for them, and exits 1 even when every worker checkpointed and exited 0, so
a clean `workbench down` looked like a trainer crash. Here the agent runs in this process
with SIGTERM left to us: we pass it on to the workers and let the agent go on watching
them, so its exit status is theirs (0 after a clean stop, 1 if one failed).

torchrun starts each worker in a session of its own, out of reach of a signal to the
agent's process group; the workers arm a parent-death signal (`workbench.system.lifeline`) so a
killed agent never leaves one behind, and this process arms one for the supervisor.

Nothing of the trainer listens beyond 127.0.0.1 unless the recipe names a network
interface (`[trainer] rendezvous_interface`, for several nodes): the agent's store through
the `workbench-static` rendezvous (`workbench.trainer.parallel.rendezvous`), registered here, in the
agent's process, bound to the endpoint's address alone; gloo's and nccl's ranks through
GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, which the workers inherit. Unless the environment
names one, the interface is the one this machine reaches the rendezvous endpoint through
(`socket_interface`): `lo` for a loopback endpoint, node 0's own interface of the address
its store binds, the route's interface on a node that joins it. A fixed `lo` would have the
ranks of nodes on different machines each listen where no other node can reach them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from workbench.system.lifeline import die_with_parent
from workbench.system.ports import interface_reaching, is_loopback
from workbench.system.priority import run_as_batch
from workbench.system.procfs import child_pids

# The agent's handler for the signals it handles raises; SIGTERM is handled here instead.
AGENT_SIGNALS = ("--signals-to-handle", "SIGINT,SIGHUP,SIGQUIT")
# The rendezvous whose store listens on the endpoint's address alone.
RENDEZVOUS_BACKEND = "workbench-static"
LOOPBACK = "127.0.0.1"
# The interface of the loopback address, for gloo's and nccl's sockets.
LOOPBACK_INTERFACE = "lo"
SOCKET_INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def rendezvous_args(
    host: str = LOOPBACK, port: int = 0, nnodes: int = 1, node_rank: int = 0
) -> list[str]:
    """torchrun's arguments for this node's agent: `nnodes` nodes meeting at node 0's store
    on `host:port` (port 0, one node only: any free port, picked when the store binds)."""
    return [
        "--nnodes", str(nnodes),
        "--rdzv-backend", RENDEZVOUS_BACKEND,
        "--rdzv-endpoint", f"{host}:{port}",
        "--rdzv-conf", f"node_rank={node_rank}",
    ]  # fmt: skip


def socket_interface_env(interface: str | None) -> dict[str, str]:
    """The environment that has gloo and nccl bind `interface`; none for the loopback
    interface, which the launcher sets unless the environment names another."""
    if interface is None:
        return {}
    return dict.fromkeys(SOCKET_INTERFACE_VARIABLES, interface)


def endpoint_host(argv: list[str]) -> str:
    """The host of torchrun's `--rdzv-endpoint HOST:PORT` in `argv` (the loopback address
    without one: torchrun's own default is a store on this machine)."""
    endpoint = ""
    for index, arg in enumerate(argv):
        if arg in ("--rdzv-endpoint", "--rdzv_endpoint") and index + 1 < len(argv):
            endpoint = argv[index + 1]
        elif arg.startswith(("--rdzv-endpoint=", "--rdzv_endpoint=")):
            endpoint = arg.split("=", 1)[1]
    host = endpoint.rsplit(":", 1)[0] if ":" in endpoint else endpoint
    return host.strip("[]") or LOOPBACK


def socket_interface(host: str) -> str | None:
    """The interface gloo's and nccl's ranks bind to meet the ranks of the nodes whose store
    is on `host`: `lo` for a loopback host, otherwise the one this machine reaches `host`
    through (None when no route reaches it)."""
    if is_loopback(host):
        return LOOPBACK_INTERFACE
    return interface_reaching(host)


def no_interface_message(host: str) -> str:
    return (
        f"no network interface of this machine reaches the rendezvous host {host}: set "
        f"{' and '.join(SOCKET_INTERFACE_VARIABLES)} to the interface the other nodes reach "
        "this one through (`workbench join --interface`, or [trainer] rendezvous_interface "
        "on node 0)"
    )


def forward_to_workers(signum: int, _frame: object) -> None:
    for pid in child_pids(os.getpid()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    run_as_batch()  # the agent; each worker, in a session of its own, does too
    signal.signal(signal.SIGTERM, forward_to_workers)
    args = sys.argv[1:] if argv is None else argv
    # gloo's and nccl's ranks listen on the address the host name resolves to, which may be
    # 127.0.1.1 or a network the other nodes do not share: they bind the interface that
    # reaches the store instead (an explicit setting is kept).
    if not all(os.environ.get(variable) for variable in SOCKET_INTERFACE_VARIABLES):
        host = endpoint_host(args)
        interface = socket_interface(host)
        if interface is None:
            print(
                f"workbench.trainer.parallel.launch: {no_interface_message(host)}", file=sys.stderr
            )
            return 2
        for variable in SOCKET_INTERFACE_VARIABLES:
            os.environ[variable] = os.environ.get(variable) or interface
    from torch.distributed.run import main as torchrun_main

    from workbench.trainer.parallel import rendezvous

    rendezvous.register(RENDEZVOUS_BACKEND)
    torchrun_main([*AGENT_SIGNALS, *args])
    return 0


if __name__ == "__main__":
    sys.exit(main())
