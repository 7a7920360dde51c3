"""`workbench join`: one more node's share of an experiment's trainer, started again each time
it stops, for as long as the experiment runs.

The experiment was started with `workbench up` on node 0, whose supervisor runs the trainer
of node 0 and wrote, in the experiment directory (on a filesystem every node shares, at the
same path), the trainer's config (`supervisor/trainer.toml`) and where its rendezvous store
listens (`supervisor/rendezvous.json`). A joining node starts the same launcher, torchrun's
agent, as node `node_rank` of `nnodes`; torchrun gives its workers their global ranks.

When any node's ranks die, the collective fails everywhere: node 0's trainer exits and its
supervisor restarts it from the checkpoints, as on one node; the agent here exits too, and
this loop starts it again to meet the new trainer. It leaves when the supervisor's state
(`supervisor/state.json`) says the experiment stops, or that the trainer will not be
restarted. A supervisor killed outright cannot say so; it also stops rewriting that file,
which a live one does at least every `STATE_HEARTBEAT_S`: once the file has not changed for
`SUPERVISOR_SILENT_S` (timed on this node's clock, so the nodes' clocks need not agree),
the agent is stopped and the join leaves.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, load_trainer_config
from workbench.files import layout
from workbench.files.nodes import NODE_HEARTBEAT_S, write_node_status
from workbench.supervisor import paths
from workbench.supervisor.client import STATE_HEARTBEAT_S, read_state
from workbench.supervisor.lifecycle import SHUTDOWN_STATUSES, TERMINAL_STATES
from workbench.supervisor.plan import read_rendezvous, trainer_argv
from workbench.system.ports import interface_names
from workbench.system.procfs import child_pids
from workbench.system.signals import sigterm_as_interrupt
from workbench.trainer.parallel.launch import (
    SOCKET_INTERFACE_VARIABLES,
    socket_interface,
    socket_interface_env,
)

# Between two agents: long enough for node 0's trainer to exit and be restarted.
RESTART_PAUSE_S = 2.0
# Node 0's supervisor is taken for gone once its state.json has not changed for this long:
# several heartbeats, for a shared filesystem that shows a write late.
SUPERVISOR_SILENT_S = 6 * STATE_HEARTBEAT_S
# How often a running agent's supervisor is looked at.
WATCH_S = 1.0
# Stopped by a signal, the agent is given this long to leave by itself when node 0 stops
# too (scancel signals every node at once): node 0's trainer checkpoints what it has
# trained, and every rank then leaves together. Killed before, this node's ranks would
# break the collective node 0 checkpoints after. Under Slurm's KillWait (30 s by default).
STOP_GRACE_S = 20.0
# A join stopped alone (node 0 still running after this long) has its ranks killed at once.
ALONE_S = 3.0


class AgentInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the agent: `ranks_killed` when its ranks were killed,
    false when they left with node 0's trainer."""

    def __init__(self, ranks_killed: bool):
        super().__init__()
        self.ranks_killed = ranks_killed


class JoinError(Exception):
    """This node cannot join the experiment (the message says why and what to do)."""


@dataclass(frozen=True)
class JoiningNode:
    """One node's trainer agent: its command, environment and log file."""

    experiment: Path
    node_rank: int
    nnodes: int
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    endpoint: str
    interface: str = "lo"  # gloo's and nccl's, for the log's line


def joining_node(experiment: Path, node_rank: int, interface: str | None = None) -> JoiningNode:
    """Node `node_rank`'s agent for the experiment that node 0 runs; `interface`: the network
    interface of this node for gloo and nccl (default: the one named by $GLOO_SOCKET_IFNAME,
    else the one this node reaches node 0's rendezvous address through)."""
    experiment = Path(experiment).resolve()
    config_path = paths.trainer_config_path(experiment)
    rendezvous = read_rendezvous(experiment)
    try:
        config = load_trainer_config(config_path)
    except ConfigError as err:
        raise JoinError(
            f"cannot read the experiment's trainer config ({err}); start the experiment with "
            "`workbench up` on node 0 first"
        ) from None
    if rendezvous is None:
        raise JoinError(
            f"{paths.rendezvous_path(experiment)} is missing: start the experiment with "
            "`workbench up` on node 0 first"
        )
    if rendezvous.nnodes == 1:
        raise JoinError(
            "the experiment's trainer runs on one node ([trainer] nnodes = 1): there is no "
            "node to join as; raise nnodes in the recipe and start it again"
        )
    if not 1 <= node_rank < rendezvous.nnodes:
        raise JoinError(
            f"--node-rank {node_rank} is not one of 1..{rendezvous.nnodes - 1} ([trainer] "
            f"nnodes = {rendezvous.nnodes}; node 0 is where `workbench up` runs)"
        )
    if not _same_directory(config.output_dir, experiment):
        raise JoinError(
            f"node 0 runs the experiment at {config.output_dir}, which is not {experiment} "
            "here: mount the shared experiment directory at the same path on every node"
        )
    if interface is not None and interface not in interface_names():
        raise JoinError(
            f"this machine has no network interface {interface!r} (it has "
            f"{', '.join(interface_names())}); name its own with --interface"
        )
    # The recipe's rendezvous_interface is node 0's: this machine's may have another name.
    interface = interface or os.environ.get(SOCKET_INTERFACE_VARIABLES[0])
    interface = interface or socket_interface(rendezvous.host)
    if interface is None:
        raise JoinError(
            f"no network interface of this machine reaches node 0's rendezvous address "
            f"{rendezvous.host}: name the one node 0 reaches this node through with --interface"
        )
    return JoiningNode(
        experiment=experiment,
        node_rank=node_rank,
        nnodes=rendezvous.nnodes,
        argv=trainer_argv(config_path, config.trainer.nproc_per_node, rendezvous, node_rank),
        env={**os.environ, **socket_interface_env(interface)},
        log_path=layout.process_log_path(experiment, f"trainer-node{node_rank}"),
        endpoint=f"{rendezvous.host}:{rendezvous.port}",
        interface=interface,
    )


def _same_directory(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def trainer_phase(state: dict[str, Any] | None) -> tuple[str, str]:
    """Whether the experiment of supervisor state `state` has a trainer to join, and why:
    ("running", ...) while it runs or will be restarted, ("stopped", why) once the
    experiment stops or has not started, ("failed", why) when the trainer gave up."""
    if state is None:
        return "stopped", "its supervisor has written no state yet"
    status = state.get("status")
    if status in SHUTDOWN_STATUSES:
        return "stopped", f"its supervisor is {status}"
    trainer = (state.get("processes") or {}).get("trainer") or {}
    if trainer.get("state") in TERMINAL_STATES:
        return "failed", f"its trainer has {trainer['state']} and will not be restarted"
    return "running", f"its supervisor is {status}"


class SupervisorWatch:
    """How long node 0's supervisor has been silent, as seen from this node: the time since
    its state.json's `updated_at` last changed, on this node's monotonic clock."""

    def __init__(self, experiment: Path, clock: Callable[[], float] = time.monotonic):
        self.experiment = experiment
        self.clock = clock
        self._stamp: Any = None
        self._since = clock()

    def look(self) -> tuple[dict[str, Any] | None, float]:
        """The supervisor's state now, and for how many seconds it has not changed."""
        state = read_state(self.experiment)
        stamp = None if state is None else state.get("updated_at")
        now = self.clock()
        if stamp != self._stamp:
            self._stamp, self._since = stamp, now
        return state, now - self._since


def run_agent(
    node: JoiningNode,
    stop_when: Callable[[], bool] = lambda: False,
    watch_s: float = WATCH_S,
    node_0_stopping: Callable[[], bool] = lambda: False,
    grace_s: float = STOP_GRACE_S,
    alone_s: float = ALONE_S,
) -> int:
    """Start this node's agent and wait for it; its exit status. Stopped early by
    `stop_when()` (true at one of its looks every `watch_s`), it is killed with its workers:
    the ranks of a node other than 0 write nothing, and they would not stop on SIGTERM,
    which only rank 0's trainer acts on. Stopped by Ctrl-C or SIGTERM, it raises
    `AgentInterrupted` once the agent is gone: while `node_0_stopping()` it is given up to
    `grace_s` to leave with node 0's trainer (`STOP_GRACE_S`), otherwise it is killed after
    `alone_s`; a second Ctrl-C kills it at once."""
    node.log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(node.log_path, "a") as log:
        agent = subprocess.Popen(
            node.argv, stdout=log, stderr=subprocess.STDOUT, env=node.env, start_new_session=True
        )
        try:
            while True:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    return agent.wait(timeout=watch_s)
                if stop_when():
                    break
        except KeyboardInterrupt:
            _wait_to_leave_with_node_0(agent, node_0_stopping, grace_s, alone_s)
            raise AgentInterrupted(ranks_killed=_kill(agent)) from None
        finally:
            _kill(agent)
        return agent.returncode


def _wait_to_leave_with_node_0(
    agent: subprocess.Popen, node_0_stopping: Callable[[], bool], grace_s: float, alone_s: float
) -> None:
    started = time.monotonic()
    while agent.poll() is None:
        waited = time.monotonic() - started
        if waited >= grace_s or (waited >= alone_s and not node_0_stopping()):
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(timeout=0.2)


def _kill(agent: subprocess.Popen) -> bool:
    """Kill the agent and its workers if it still runs; whether it did."""
    if agent.poll() is not None:
        return False
    for pid in [agent.pid, *child_pids(agent.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    agent.wait()
    return True


class NodeReport:
    """This node's file under `nodes/` (`workbench.files.nodes`): its state on every change,
    and again every `NODE_HEARTBEAT_S` while it lasts, so node 0's `status` can tell a
    join that runs from one killed outright."""

    def __init__(self, node: JoiningNode, clock: Callable[[], float] = time.monotonic):
        self.node = node
        self.clock = clock
        self.host = socket.gethostname()
        self.state = "waiting"
        self.restarts = 0
        self.reason: str | None = None
        self._written_at = -float("inf")

    def set(self, state: str, reason: str | None = None) -> None:
        self.state, self.reason = state, reason
        self._write()

    def heartbeat(self) -> None:
        if self.clock() - self._written_at >= NODE_HEARTBEAT_S:
            self._write()

    def _write(self) -> None:
        with contextlib.suppress(OSError):  # a report lost is no reason to stop training
            write_node_status(
                self.node.experiment,
                self.node.node_rank,
                self.node.nnodes,
                self.host,
                os.getpid(),
                self.state,
                self.restarts,
                self.reason,
            )
        self._written_at = self.clock()


def join(
    node: JoiningNode,
    say: Callable[[str], None],
    pause_s: float = RESTART_PAUSE_S,
    silent_s: float = SUPERVISOR_SILENT_S,
    watch_s: float = WATCH_S,
) -> int:
    """Run node's agent again and again while the experiment runs; 0 once it stops, 1 when
    it was not running, its trainer gave up or its supervisor went silent (see the module's
    docstring). SIGTERM stops it as Ctrl-C does. What it does is kept in its file under
    `nodes/` (`NodeReport`)."""
    report = NodeReport(node)
    try:
        code = _join(node, say, report, pause_s, silent_s, watch_s)
    except AgentInterrupted as stopped:
        if stopped.ranks_killed:
            report.set(
                "failed", "stopped by a signal (Ctrl-C, SIGTERM, scancel); its ranks were killed"
            )
        else:
            report.set("left", "stopped by a signal with node 0 (scancel)")
        raise
    except KeyboardInterrupt:
        report.set("failed", "stopped by a signal (Ctrl-C, SIGTERM, scancel)")
        raise
    if code != 0 and report.state != "failed":
        report.set("failed", report.reason)
    return code


def _join(
    node: JoiningNode,
    say: Callable[[str], None],
    report: NodeReport,
    pause_s: float,
    silent_s: float,
    watch_s: float,
) -> int:
    name = f"node {node.node_rank}/{node.nnodes}"
    watch = SupervisorWatch(node.experiment)
    phase, why = trainer_phase(watch.look()[0])
    if phase != "running":
        say(f"{name}: the experiment is not running ({why}); start it with `workbench up` first")
        report.set("failed", f"the experiment was not running ({why})")
        return 1

    def silent() -> bool:
        report.heartbeat()
        return watch.look()[1] >= silent_s

    with sigterm_as_interrupt():
        while True:
            report.set("running")
            say(
                f"{name}: trainer agent meets node 0 at {node.endpoint} through "
                f"{node.interface} (log: {node.log_path})"
            )
            code = run_agent(
                node,
                stop_when=silent,
                watch_s=watch_s,
                node_0_stopping=lambda: trainer_phase(watch.look()[0])[0] != "running",
            )
            say(f"{name}: trainer agent exited with status {code}")
            state, quiet_for = watch.look()
            if quiet_for >= silent_s:
                state_file = paths.state_path(node.experiment)
                say(
                    f"{name}: leaving: its supervisor has not written {state_file} for "
                    f"{quiet_for:.0f} s: it was killed outright. Start the experiment again "
                    "with `workbench up` on node 0, then join again"
                )
                report.set("failed", f"node 0's supervisor went silent for {quiet_for:.0f} s")
                return 1
            phase, why = trainer_phase(state)
            if phase != "running":
                say(f"{name}: leaving: {why}")
                report.set("left" if phase == "stopped" else "failed", why)
                return 1 if phase == "failed" else 0
            report.restarts += 1
            report.set("restarting", f"its agent exited with status {code}; meeting node 0 again")
            time.sleep(pause_s)


def wait_for_supervisor(
    experiment: Path,
    wait_s: float,
    say: Callable[[str], None],
    poll_s: float = WATCH_S,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Wait up to `wait_s` for a live supervisor on node 0: one whose state.json says it
    runs and changes while this node watches (a file left by a supervisor that stopped or
    was killed does not count); whether one came. For nodes started at the same time as
    node 0, as a Slurm job's are."""
    first = read_state(experiment)
    first_stamp = None if first is None else first.get("updated_at")
    deadline = clock() + wait_s
    say(f"waiting up to {wait_s:g} s for node 0's supervisor ({paths.state_path(experiment)})")
    while True:
        state = read_state(experiment)
        stamp = None if state is None else state.get("updated_at")
        fresh = stamp is not None and (stamp != first_stamp or trainer_phase(first)[0] != "running")
        running = fresh and trainer_phase(state)[0] == "running"
        if running and paths.rendezvous_path(experiment).is_file():
            return True
        if clock() >= deadline:
            return False
        time.sleep(poll_s)
