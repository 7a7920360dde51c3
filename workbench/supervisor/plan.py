"""Turn an experiment's recipe into the processes the supervisor runs (docs/contracts.md).

`plan_from_recipe(experiment)` picks free ports, draws the per-experiment API key, assigns
GPUs, writes `supervisor/inference.toml`, `supervisor/trainer.toml` and
`supervisor/endpoint.json` (mode 0600), and returns a `Plan`: the inference server and the
trainer in start order, plus a function that builds one run's orchestrator. The two config
files, for `recipes/reverse_text.toml`, are in `configs/` as examples.

The supervisor only sees `Plan` and `ProcessSpec`s, so tests hand it stand-in commands
through any other plan factory (`load_plan_factory("path/to/file.py:plan")`).

GPUs follow prime-rl's launcher: inference takes the first devices, the trainer the next
ones; with one GPU they share it (the recipe lowers vLLM's memory fraction); with no GPU
nothing is set and everything runs on the CPU, whatever the recipe lists.

The trainer may span `[trainer] nnodes` machines: this one is node 0, whose torchrun agent
holds the rendezvous store on `[trainer] rendezvous_interface`'s address (127.0.0.1 by
default); the plan writes that address to `supervisor/rendezvous.json`, where the other
nodes' `workbench join` (`workbench.supervisor.join`) finds it.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import secrets
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from workbench.config import ConfigError, TrainerSection, model_to_toml
from workbench.config.alerts import AlertsSection
from workbench.files import endpoint, layout
from workbench.inference.engine_errors import engine_fatal_error
from workbench.recipe import Recipe, load_recipe
from workbench.supervisor import paths
from workbench.supervisor.devices import (  # PlanError: re-exported, callers reach it here
    DeviceAssignment,
    PlanError,
    assign_devices,
)
from workbench.supervisor.policy import RestartPolicy
from workbench.supervisor.process import HttpReady, ProcessSpec
from workbench.supervisor.slots import resolve_auto_slots
from workbench.supervisor.tinker_service import service_spec as tinker_service_spec
from workbench.sweep import schedulers
from workbench.sweep.spec import AshaSpec, PbtSpec
from workbench.system.gpus import detect_gpu_count  # preflight and tests reach it here
from workbench.system.lifeline import PARENT_PID_ENV
from workbench.system.ports import (
    bind_error,
    free_port,
    interface_ipv4,
    interface_names,
    is_loopback,
)
from workbench.system.priority import NICE_ENV, inference_nice
from workbench.system.small_machine import is_small_machine
from workbench.tracking.target import TrackingTarget
from workbench.trainer.parallel.launch import LOOPBACK, rendezvous_args, socket_interface_env

DEFAULT_PLAN = "workbench.supervisor.plan:plan_from_recipe"
INFERENCE_MODULE = "workbench.inference"
TRAINER_MODULE = "workbench.trainer.rl.trainer"
# torchrun's agent, run so that a SIGTERM-ed trainer exits with its workers' status and
# its rendezvous store listens on one address only.
TRAINER_LAUNCHER = "workbench.trainer.parallel.launch"
ORCHESTRATOR_MODULE = "workbench.orchestrator"

# Exit code 2 is "my setup is wrong" (bad config, vLLM missing, port taken) for inference and
# orchestrators, 3 an orchestrator's self-eviction: restarting cannot help. torchrun reports
# any worker failure as 1, so the trainer has no such code. Inference and the trainer are
# services: while the experiment runs, even a clean exit (a stray SIGTERM: the trainer
# checkpoints and exits 0) is restarted; the supervisor's own stops are not.
INFERENCE_RESTART = RestartPolicy(
    mode="always",
    max_restarts=3,
    backoff_initial_s=2.0,
    backoff_max_s=60.0,
    permanent_exit_codes=(2,),
)
TRAINER_RESTART = RestartPolicy(
    mode="always", max_restarts=3, backoff_initial_s=2.0, backoff_max_s=60.0
)
ORCHESTRATOR_RESTART = RestartPolicy(
    max_restarts=5, backoff_initial_s=1.0, backoff_max_s=30.0, permanent_exit_codes=(2, 3)
)
# The trainer checkpoints every run on SIGTERM; give it time before SIGKILL.
TRAINER_STOP_TIMEOUT_S = 60.0
INFERENCE_STOP_TIMEOUT_S = 20.0
ORCHESTRATOR_STOP_TIMEOUT_S = 20.0


@dataclass
class Plan:
    """What the supervisor runs: fixed processes in start order, and one orchestrator per run.

    orchestrator(run_id, run_dir) builds the spec of a run's orchestrator when discovery
    finds the run. notes are logged by the supervisor at start (choices it made).
    early_stopping, when set, is the sweep's scheduler: ASHA evicts runs that fall behind at a
    rung; PBT has runs that fall behind take the checkpoint of runs ahead.
    tracking, when set, has it forward every run's metrics to a tracker (workbench.tracking).
    alerts: the rules it checks as records arrive (workbench.alerts; on by default).
    """

    processes: list[ProcessSpec]
    orchestrator: Callable[[str, Path], ProcessSpec]
    notes: list[str] = field(default_factory=list)
    placement: str = ""  # which GPUs run what, and how the trainer's ranks hold the base
    early_stopping: AshaSpec | PbtSpec | None = None
    tracking: TrackingTarget | None = None
    alerts: AlertsSection = field(default_factory=AlertsSection)


PlanFactory = Callable[[Path], Plan]


def load_plan_factory(reference: str) -> PlanFactory:
    """`package.module:function` or `/path/to/file.py:function` -> that function."""
    target, sep, attribute = reference.rpartition(":")
    if not sep or not target or not attribute:
        raise PlanError(f"plan {reference!r}: expected MODULE:FUNCTION or FILE.py:FUNCTION")
    if target.endswith(".py"):
        spec = importlib.util.spec_from_file_location(
            f"_workbench_plan_{Path(target).stem}", target
        )
        if spec is None or spec.loader is None:
            raise PlanError(f"plan {reference!r}: cannot load {target}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise PlanError(f"plan {reference!r}: {target} has no function {attribute!r}")
    return factory


# ---------------------------------------------------------------- ports and devices


def choose_port(requested: int, host: str, what: str) -> int:
    """`requested`, checked free, or a free port when `requested` is 0."""
    if requested == 0:
        return free_port(host)
    problem = port_problem(requested, host)
    if problem is not None:
        raise PlanError(f"{what}: {problem}")
    return requested


def port_problem(requested: int, host: str) -> str | None:
    """Why a server cannot listen on `host:requested` now (a port other than 0), or None."""
    err = bind_error(host, requested)
    if err is not None and err.errno == errno.EADDRINUSE:
        return (
            f"port {requested} on {host} is already in use; stop whatever listens there "
            "or set the port to 0 in the recipe to pick a free one"
        )
    if err is not None:
        return f"cannot use {host}:{requested}: {err.strerror}"
    return None


# Node 0's rendezvous address, set by whoever knows it better than the recipe (a Slurm job).
RENDEZVOUS_HOST_ENV = "WORKBENCH_RENDEZVOUS_HOST"


@dataclass(frozen=True)
class Rendezvous:
    """Where node 0's rendezvous store listens (`supervisor/rendezvous.json`), for `nnodes`."""

    host: str
    port: int
    nnodes: int

    def describe(self) -> str:
        """One line for `up --dry-run` and the supervisor's log."""
        port = "a free port" if self.port == 0 else f"port {self.port}"
        line = f"trainer on {self.nnodes} node(s): rendezvous on {self.host}, {port}"
        if self.host != LOOPBACK:
            return line + (
                "; the other nodes join with `workbench join`" if self.nnodes > 1 else ""
            )
        if self.nnodes > 1:
            return line + ", loopback only: every node must run on this machine"
        return line + " (loopback only; set [trainer] rendezvous_interface to let other nodes join)"


def rendezvous_host(interface: str | None) -> tuple[str | None, str | None]:
    """The address node 0's store binds for `interface` (None: the loopback address), or
    None and why there is none on this machine. $WORKBENCH_RENDEZVOUS_HOST, where set, is
    that address instead: a Slurm job's script sets it to its first node's address. In a
    job across machines a loopback one is refused, unless the recipe names the interface."""
    override = os.environ.get(RENDEZVOUS_HOST_ENV)
    if override and is_loopback(override) and slurm_machines() > 1:
        # The job script's getent found this node's name on a loopback address (Debian
        # maps a host's own name to 127.0.1.1): the job's other machines cannot reach it.
        if interface is None:
            return None, loopback_across_machines(override)
        override = None  # the recipe's interface says where the others reach this node
    if override:
        if bind_error(override, 0) is not None:
            return None, (
                f"${RENDEZVOUS_HOST_ENV} {override!r} is not an address of this machine; "
                "set it to the address the other nodes reach node 0 at, or unset it"
            )
        return override, None
    if interface is None:
        return LOOPBACK, None
    names = interface_names()
    if interface not in names:
        return None, (
            f"[trainer] rendezvous_interface {interface!r} is not a network interface of this "
            f"machine (it has {', '.join(names)}); name the one the other nodes reach it "
            "through, or leave it out for the loopback interface"
        )
    address = interface_ipv4(interface)
    if address is None:
        return None, f"[trainer] rendezvous_interface {interface!r} has no IPv4 address"
    return address, None


def slurm_machines() -> int:
    """How many machines the Slurm job this process runs in spans (0 outside one): each
    task of `srun` has the allocation's node count in its environment."""
    for variable in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value)
    return 0


def loopback_across_machines(address: str) -> str:
    return (
        f"${RENDEZVOUS_HOST_ENV} {address!r}, the address this node's name resolves to here "
        f"(the Slurm job script's `getent ahostsv4`), is a loopback address, which the "
        f"job's other {slurm_machines() - 1} machine(s) cannot reach: set [trainer] "
        "rendezvous_interface in the recipe to this node's network interface that they "
        f"reach it through (this machine has {', '.join(interface_names())}), and submit "
        "the job again"
    )


def rendezvous_problems(interface: str | None, port: int) -> list[tuple[str, str]]:
    """What stops node 0's rendezvous store from listening as the recipe asks, as (dotted key,
    message): an interface this machine lacks or that has no IPv4 address, a port in use."""
    host, problem = rendezvous_host(interface)
    if host is None:
        return [("trainer.rendezvous_interface", str(problem))]
    problem = port_problem(port, host) if port else None
    if problem is not None:
        return [("trainer.rendezvous_port", f"[trainer] rendezvous_port: {problem}")]
    return []


def recipe_rendezvous(recipe: Recipe) -> Rendezvous:
    """Where the recipe's trainer meets; `PlanError` naming the key when it cannot."""
    trainer = recipe.trainer
    problems = rendezvous_problems(trainer.rendezvous_interface, trainer.rendezvous_port)
    host, _ = rendezvous_host(trainer.rendezvous_interface)
    if problems or host is None:
        raise PlanError(f"recipe {problems[0][1]}")
    return Rendezvous(host, trainer.rendezvous_port, trainer.nnodes)


def write_rendezvous(experiment: Path, rendezvous: Rendezvous) -> None:
    """`supervisor/rendezvous.json`, written on node 0: the store's address and port, the
    number of nodes, and node 0's host name (for `status`' nodes table)."""
    payload = {
        "host": rendezvous.host,
        "port": rendezvous.port,
        "nnodes": rendezvous.nnodes,
        "node0_host": socket.gethostname(),
    }
    layout.atomic_write_text(paths.rendezvous_path(experiment), json.dumps(payload) + "\n")


def read_rendezvous(experiment: Path) -> Rendezvous | None:
    """What the plan wrote to `supervisor/rendezvous.json`, or None without one."""
    try:
        payload = json.loads(paths.rendezvous_path(experiment).read_text(encoding="utf-8"))
        return Rendezvous(str(payload["host"]), int(payload["port"]), int(payload["nnodes"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def recipe_devices(recipe: Recipe, gpu_count: int) -> tuple[DeviceAssignment, str]:
    """Where the recipe's processes run on a machine with `gpu_count` GPUs, and that in a
    line; `PlanError` when its GPUs do not add up (preflight says so first, with lines)."""
    inference, trainer = recipe.inference, recipe.trainer
    size = inference.tensor_parallel_size * inference.data_parallel_size
    devices = assign_devices(inference.gpus, trainer.gpus, trainer.nproc_per_node, gpu_count, size)
    return devices, f"{describe_devices(devices, gpu_count, size)}; {describe_ranks(trainer)}"


def describe_ranks(trainer: TrainerSection) -> str:
    """How many trainer ranks there are and how they hold the frozen base, in a phrase."""
    ranks = trainer.nproc_per_node * trainer.nnodes
    if ranks == 1:
        return "trainer: 1 rank, the whole base"
    if trainer.nnodes > 1:
        ranks_text = f"{ranks} ranks ({trainer.nnodes} nodes x {trainer.nproc_per_node})"
    else:
        ranks_text = f"{ranks} ranks"
    holding = (
        "base sharded over them (FSDP2)"
        if trainer.shards_base(ranks)
        else "base replicated on each"
    )
    return f"trainer: {ranks_text}, {holding}"


def describe_devices(devices: DeviceAssignment, gpu_count: int, inference_size: int) -> str:
    """Which GPUs run what, in one line (`up --dry-run`, the supervisor's log)."""
    if devices.inference is None:
        return "no GPU: inference and trainer run on the CPU"
    shared = set(devices.inference) & set(devices.trainer or [])
    line = (
        f"{gpu_count} GPU(s): inference on {devices.inference}"
        + (f" ({inference_size} for vLLM's parallelism)" if inference_size > 1 else "")
        + f", trainer on {devices.trainer}"
    )
    return line + (f" (sharing {sorted(shared)})" if shared else "")


def shared_cpu_env(gpu_count: int, threads: int | None = None) -> dict[str, str]:
    """Thread settings for processes that share the CPU cores.

    With no GPU, vLLM, the trainer and the orchestrators all compute on the same cores.
    OpenMP's default is to spin-wait for work; with more busy threads than cores those
    spinning threads starve the ones with work. Measured on a 2-core machine under load:
    a 500x128 @ 128x384 matmul took 2457 us with 2 active threads and 409 us with
    OMP_WAIT_POLICY=PASSIVE, and one trainer update went from 10.2 s to 0.6 s. A user's
    own setting wins.
    """
    if gpu_count:
        return {}
    env = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", str(threads))
    return env


def cuda_env(devices: list[int] | None) -> dict[str, str]:
    if devices is None:
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(gpu) for gpu in devices)}


# ---------------------------------------------------------------- commands


def module_problem(module: str) -> str | None:
    """Why `python -m module` would fail to find the module, or None if it exists.

    Looks for the file instead of importing it: importing `workbench.trainer` in the
    supervisor would pull torch into a process that never needs it.
    """
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return f"module {module} is not installed (no package {top!r})"
    if not rest:
        return None
    roots = list(spec.submodule_search_locations or [])
    parts = rest.split(".")
    for root in roots:
        base = Path(root).joinpath(*parts)
        if base.with_suffix(".py").is_file() or (base / "__main__.py").is_file():
            return None
    where = Path(roots[0]).joinpath(*parts) if roots else Path(*parts)
    return (
        f"module {module} not found (looked for {where}.py and {where}/__main__.py); "
        "that part of workbench is not installed in this checkout"
    )


@dataclass(frozen=True)
class EndpointHealth:
    """Ready when `/health` answers 200 at the address in `supervisor/endpoint.json`, which
    the inference process rewrites when it had to move to a new port."""

    experiment: Path

    @property
    def url(self) -> str | None:
        current = endpoint.read_endpoint(self.experiment)
        return None if current is None else f"{current.server_url}/health"

    def is_ready(self) -> bool:
        url = self.url
        return url is not None and HttpReady(url).is_ready()

    def describe(self) -> str:
        return f"GET {self.url} answers 200"


def _module_preflight(module: str) -> Callable[[], str | None]:
    return lambda: module_problem(module)


def trainer_argv(
    config_path: Path, nproc_per_node: int, rendezvous: Rendezvous, node_rank: int = 0
) -> list[str]:
    """The command of one node's trainer: torchrun's agent (`workbench.trainer.parallel.launch`) with
    `nproc_per_node` workers, meeting the other nodes at `rendezvous`."""
    return [
        sys.executable, "-m", TRAINER_LAUNCHER,
        "--nproc_per_node", str(nproc_per_node),
        *rendezvous_args(rendezvous.host, rendezvous.port, rendezvous.nnodes, node_rank),
        "-m", TRAINER_MODULE, "--config", str(config_path),
    ]  # fmt: skip


def orchestrator_spec(run_id: str, run_dir: Path, env: dict[str, str] | None = None) -> ProcessSpec:
    return ProcessSpec(
        name=run_id,
        kind="orchestrator",
        run_id=run_id,
        argv=[sys.executable, "-m", ORCHESTRATOR_MODULE, "--run-dir", str(run_dir)],
        log_path=layout.orchestrator_log_path(run_dir),
        env=dict(env or {}),
        requires_ready=("inference",),
        restart=ORCHESTRATOR_RESTART,
        stop_timeout_s=ORCHESTRATOR_STOP_TIMEOUT_S,
        preflight=_module_preflight(ORCHESTRATOR_MODULE),
        # In the supervisor's session, so that runs do not each add an autogroup that
        # outweighs the user's TUI (`ProcessSpec.own_session`).
        own_session=False,
    )


def plan_from_recipe(experiment: Path) -> Plan:
    """The real plan: vLLM inference, the torchrun trainer, one orchestrator per run."""
    experiment = Path(experiment).resolve()
    recipe = _load_recipe(experiment)
    inference_port = choose_port(recipe.inference.port, recipe.inference.host, "[inference] port")
    gpu_count = detect_gpu_count()
    devices, placement = recipe_devices(recipe, gpu_count)
    rendezvous = recipe_rendezvous(recipe)
    early_stopping = recipe.sweep.scheduler if recipe.sweep is not None else None
    notes = _plan_notes(recipe, gpu_count, placement, rendezvous, early_stopping)
    tracking = TrackingTarget.from_recipe(recipe)
    api_key = _write_process_files(experiment, recipe, inference_port, rendezvous)
    orchestrator_env = _orchestrator_env(gpu_count)
    processes = [
        _inference_spec(experiment, recipe, devices, gpu_count, api_key),
        _trainer_spec(experiment, recipe, devices, gpu_count, rendezvous),
    ]
    tinker = tinker_service_spec(experiment)  # `workbench serve` asked for it
    return Plan(
        processes=processes if tinker is None else [*processes, tinker],
        orchestrator=lambda run_id, run_dir: orchestrator_spec(run_id, run_dir, orchestrator_env),
        notes=notes,
        placement=placement,
        early_stopping=early_stopping,
        tracking=tracking,
        alerts=recipe.alerts,
    )


def _load_recipe(experiment: Path) -> Recipe:
    """The experiment's recipe; `max_concurrent_runs = "auto"` sized here when the
    recipe.toml was not written by `workbench up` (which writes the number)."""
    try:
        recipe = load_recipe(layout.recipe_path(experiment))
    except ConfigError as err:
        raise PlanError(f"cannot start the experiment: {err}") from None
    resolve_auto_slots(recipe)
    return recipe


def _plan_notes(
    recipe: Recipe,
    gpu_count: int,
    placement: str,
    rendezvous: Rendezvous,
    early_stopping: AshaSpec | PbtSpec | None,
) -> list[str]:
    """What the supervisor says about the plan as it starts: GPUs, placement, rendezvous,
    early stopping."""
    notes: list[str] = []
    if gpu_count == 0 and (recipe.inference.gpus or recipe.trainer.gpus):
        notes.append("no GPU on this machine: the recipe's gpus lists are ignored")
    notes.append(placement)
    notes.append(rendezvous.describe())
    if early_stopping is not None and recipe.sweep is not None:
        max_steps = recipe.defaults.max_steps
        notes.append(schedulers.describe_scheduler(early_stopping, recipe.sweep, max_steps))
    return notes


def _write_process_files(
    experiment: Path, recipe: Recipe, inference_port: int, rendezvous: Rendezvous
) -> str:
    """The files the children start from: inference's and the trainer's configs, the
    rendezvous, and the endpoint orchestrators will find the server at. Returns the
    server's new API key."""
    inference_config = recipe.inference_config()
    inference_config.output_dir = experiment
    inference_config.inference.port = inference_port
    trainer_config = recipe.trainer_config()
    trainer_config.output_dir = experiment
    layout.atomic_write_text(
        paths.inference_config_path(experiment),
        model_to_toml(inference_config, header="Written by the workbench supervisor."),
    )
    layout.atomic_write_text(
        paths.trainer_config_path(experiment),
        model_to_toml(trainer_config, header="Written by the workbench supervisor."),
    )
    write_rendezvous(experiment, rendezvous)
    api_key = secrets.token_urlsafe(32)
    write_endpoint(
        experiment,
        base_url=f"http://127.0.0.1:{inference_port}/v1",
        api_key=api_key,
        model=recipe.model.base,
    )
    return api_key


def _orchestrator_env(gpu_count: int) -> dict[str, str]:
    # Orchestrators never need a GPU; hiding them keeps a stray CUDA init off the devices.
    env = {"CUDA_VISIBLE_DEVICES": ""} if gpu_count else {}
    # Orchestrators do little arithmetic (rewards, advantages): one thread each.
    env.update(shared_cpu_env(gpu_count, threads=1))
    # Children stop when the supervisor dies (workbench.system.lifeline explains why).
    env[PARENT_PID_ENV] = str(os.getpid())
    return env


def _inference_spec(
    experiment: Path, recipe: Recipe, devices: DeviceAssignment, gpu_count: int, api_key: str
) -> ProcessSpec:
    argv = [
        sys.executable,
        "-m",
        INFERENCE_MODULE,
        "--config",
        str(paths.inference_config_path(experiment)),
    ]
    if recipe.inference.port == 0:  # any free port will do: move if this one is taken
        argv.append("--move-port-if-taken")
    return ProcessSpec(
        name="inference",
        kind="inference",
        argv=argv,
        log_path=layout.process_log_path(experiment, "inference"),
        env={
            **cuda_env(devices.inference),
            **shared_cpu_env(gpu_count),
            # It raises its own nice value to this as it starts (workbench.system.priority).
            NICE_ENV: str(inference_nice(is_small_machine())),
            "VLLM_API_KEY": api_key,
            PARENT_PID_ENV: str(os.getpid()),
        },
        readiness=EndpointHealth(experiment),
        ready_timeout_s=recipe.inference.startup_timeout_s,
        restart=INFERENCE_RESTART,
        stop_timeout_s=INFERENCE_STOP_TIMEOUT_S,
        preflight=_module_preflight(INFERENCE_MODULE),
        # vLLM's API server exits 0 after its engine died; its log says why.
        exit_cause=engine_fatal_error,
    )


def _trainer_spec(
    experiment: Path,
    recipe: Recipe,
    devices: DeviceAssignment,
    gpu_count: int,
    rendezvous: Rendezvous,
) -> ProcessSpec:
    ranks = recipe.trainer.nproc_per_node
    return ProcessSpec(
        name="trainer",
        kind="trainer",
        argv=trainer_argv(paths.trainer_config_path(experiment), ranks, rendezvous),
        log_path=layout.process_log_path(experiment, "trainer"),
        env={
            **cuda_env(devices.trainer),
            **socket_interface_env(recipe.trainer.rendezvous_interface),
            # One thread where vLLM and the trainer take turns on two cores
            # (workbench.system.small_machine has the figures).
            **shared_cpu_env(gpu_count, threads=1 if is_small_machine() else None),
            PARENT_PID_ENV: str(os.getpid()),
        },
        restart=TRAINER_RESTART,
        stop_timeout_s=TRAINER_STOP_TIMEOUT_S,
        preflight=_module_preflight(TRAINER_MODULE),
    )


def write_endpoint(experiment: Path, *, base_url: str, api_key: str, model: str) -> Path:
    """`supervisor/endpoint.json`, readable by the owner only: it holds the API key."""
    return endpoint.write_endpoint(experiment, endpoint.Endpoint(base_url, api_key, model))
