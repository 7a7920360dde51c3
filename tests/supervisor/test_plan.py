"""The real plan: ports, API key, GPUs, command lines and config files per docs/contracts.md."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from pathlib import Path

import pytest

from workbench.config import TrainerSection, load_inference_config, load_trainer_config
from workbench.files import layout
from workbench.files.endpoint import Endpoint, read_endpoint, write_endpoint
from workbench.inference.server import parallel_args
from workbench.supervisor import paths, plan
from workbench.supervisor.devices import DeviceAssignment, assign_devices, device_problems
from workbench.supervisor.plan import (
    PlanError,
    describe_devices,
    describe_ranks,
    load_plan_factory,
    module_problem,
    plan_from_recipe,
)
from workbench.system import ports
from workbench.system.lifeline import PARENT_PID_ENV
from workbench.system.priority import DEFAULT_NICE, INFERENCE_YIELDS_BY, NICE_ENV

RECIPE = """\
[model]
base = "builtin:tiny-reverse"
[inference]
port = {port}
[trainer]
nproc_per_node = {ranks}
"""


def write_recipe(experiment: Path, port: int = 0, ranks: int = 1) -> None:
    experiment.mkdir(parents=True, exist_ok=True)
    layout.recipe_path(experiment).write_text(RECIPE.format(port=port, ranks=ranks))


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(plan, "detect_gpu_count", lambda: 0)


def test_no_gpu_leaves_cuda_visible_devices_unset(experiment: Path, no_gpu):
    write_recipe(experiment)
    result = plan_from_recipe(experiment)
    for spec in result.processes:
        assert "CUDA_VISIBLE_DEVICES" not in spec.env
    assert "CUDA_VISIBLE_DEVICES" not in result.orchestrator("run_a", experiment / "run_a").env
    # What the supervisor records for `status` to show.
    assert result.placement == (
        "no GPU: inference and trainer run on the CPU; trainer: 1 rank, the whole base"
    )


def test_gpus_go_to_inference_first_then_trainer_and_are_shared_when_too_few():
    assert assign_devices([], [], 1, 0) == DeviceAssignment(None, None)
    assert assign_devices([], [], 1, 1) == DeviceAssignment([0], [0])
    assert assign_devices([], [], 1, 2) == DeviceAssignment([0], [1])
    assert assign_devices([], [], 2, 4) == DeviceAssignment([0], [1, 2])
    assert assign_devices([3], [0, 1], 2, 4) == DeviceAssignment([3], [0, 1])
    assert assign_devices([], [], 2, 2) == DeviceAssignment([0], [0, 1])


def test_a_gpu_the_machine_does_not_have_is_an_error_naming_the_key():
    with pytest.raises(PlanError, match=r"\[trainer\] gpus lists \[5\].*2 GPU"):
        assign_devices([], [5], 1, 2)


def test_vllms_tensor_and_data_parallelism_take_that_many_gpus_first_then_the_trainer():
    # 8 GPUs, vLLM 2 x 2, trainer 4 ranks: apart
    devices = assign_devices([], [], 4, 8, inference_size=4)
    assert devices == DeviceAssignment([0, 1, 2, 3], [4, 5, 6, 7])
    assert describe_devices(devices, 8, 4) == (
        "8 GPU(s): inference on [0, 1, 2, 3] (4 for vLLM's parallelism), trainer on [4, 5, 6, 7]"
    )
    # 4 GPUs, vLLM on 2, trainer 4 ranks: not enough to keep apart, so they share
    devices = assign_devices([], [], 4, 4, inference_size=2)
    assert devices == DeviceAssignment([0, 1], [0, 1, 2, 3])
    assert describe_devices(devices, 4, 2).endswith("(sharing [0, 1])")
    assert assign_devices([6, 7], [], 2, 8, inference_size=2) == DeviceAssignment([6, 7], [0, 1])


def test_gpus_that_do_not_add_up_are_refused_naming_the_keys():
    ((key, message),) = device_problems([], [], 1, 2, inference_size=4)
    assert key == "inference.tensor_parallel_size"
    assert "= 4 GPUs for vLLM, but this machine has 2" in message
    ((key, message),) = device_problems([0, 1, 2], [], 1, 8, inference_size=2)
    assert key == "inference.gpus" and "lists 3 GPU(s) [0, 1, 2]" in message
    ((key, message),) = device_problems([], [], 1, 0, inference_size=2)
    assert key == "inference.tensor_parallel_size" and "no GPU" in message
    assert device_problems([], [], 1, 0) == []  # the CPU machine's default
    with pytest.raises(PlanError, match="tensor_parallel_size x data_parallel_size = 4"):
        assign_devices([], [], 1, 2, inference_size=4)


def test_vllm_gets_its_parallelism_flags_only_beyond_one_gpu():
    assert parallel_args(1, 1) == []
    assert parallel_args(2, 3) == ["--tensor-parallel-size", "2", "--data-parallel-size", "3"]


def test_plan_with_two_gpus_sets_cuda_visible_devices_per_process(experiment: Path, monkeypatch):
    monkeypatch.setattr(plan, "detect_gpu_count", lambda: 2)
    write_recipe(experiment)
    inference, trainer = plan_from_recipe(experiment).processes
    assert inference.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == "1"


def test_plan_writes_configs_and_an_owner_only_endpoint_with_a_random_key(experiment: Path, no_gpu):
    write_recipe(experiment, ranks=2)
    result = plan_from_recipe(experiment)
    inference, trainer = result.processes

    endpoint = json.loads(paths.endpoint_path(experiment).read_text())
    assert stat.S_IMODE(paths.endpoint_path(experiment).stat().st_mode) == 0o600
    assert len(endpoint["api_key"]) >= 32 and endpoint["model"] == "builtin:tiny-reverse"
    port = load_inference_config(paths.inference_config_path(experiment)).inference.port
    assert port > 0 and endpoint["base_url"] == f"http://127.0.0.1:{port}/v1"
    assert inference.env["VLLM_API_KEY"] == endpoint["api_key"]
    assert inference.readiness.url == f"http://127.0.0.1:{port}/health"
    assert inference.argv[1:] == [
        "-m",
        "workbench.inference",
        "--config",
        str(paths.inference_config_path(experiment)),
        "--move-port-if-taken",  # the recipe asked for any free port
    ]
    trainer_config = load_trainer_config(paths.trainer_config_path(experiment))
    assert trainer_config.output_dir == experiment.resolve()
    assert trainer.argv[trainer.argv.index("--nproc_per_node") + 1] == "2"
    assert "--rdzv-backend" in trainer.argv and "127.0.0.1:0" in trainer.argv
    assert trainer.argv[:3] == [sys.executable, "-m", "workbench.trainer.parallel.launch"]
    assert trainer.argv[-4:] == [
        "-m",
        "workbench.trainer.rl.trainer",
        "--config",
        str(paths.trainer_config_path(experiment)),
    ]
    orchestrator = result.orchestrator("run_a", experiment / "run_a")
    assert orchestrator.argv == [
        sys.executable,
        "-m",
        "workbench.orchestrator",
        "--run-dir",
        str(experiment / "run_a"),
    ]
    assert orchestrator.requires_ready == ("inference",)
    assert orchestrator.log_path == layout.orchestrator_log_path(experiment / "run_a")

    plan_from_recipe(experiment)
    assert (
        json.loads(paths.endpoint_path(experiment).read_text())["api_key"] != endpoint["api_key"]
    ), "every start draws a new key"


def test_inference_readiness_follows_the_port_in_endpoint_json(experiment: Path, no_gpu):
    write_recipe(experiment)
    inference = plan_from_recipe(experiment).processes[0]
    current = read_endpoint(experiment)
    write_endpoint(experiment, Endpoint("http://127.0.0.1:12345/v1", current.api_key, "m"))
    assert inference.readiness.url == "http://127.0.0.1:12345/health"


def test_children_get_the_supervisors_pid_to_die_with_it(experiment: Path, no_gpu):
    write_recipe(experiment)
    result = plan_from_recipe(experiment)
    specs = [*result.processes, result.orchestrator("run_a", experiment / "run_a")]
    assert all(spec.env[PARENT_PID_ENV] == str(os.getpid()) for spec in specs)


def test_a_fixed_inference_port_in_use_is_refused_naming_the_port(experiment: Path, no_gpu):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        write_recipe(experiment, port=port)
        with pytest.raises(PlanError, match=f"port {port} .* already in use"):
            plan_from_recipe(experiment)


def test_an_invalid_recipe_is_a_plan_error_naming_the_file(experiment: Path):
    experiment.mkdir(exist_ok=True)
    layout.recipe_path(experiment).write_text("[model]\nbase = 'x'\n[trainer]\nbogus = 1\n")
    with pytest.raises(PlanError, match=r"recipe.toml, line 4: trainer.bogus: unknown key"):
        plan_from_recipe(experiment)


def test_module_problem_finds_modules_without_importing_them():
    assert module_problem("workbench.supervisor") is None
    assert module_problem("workbench.supervisor.daemon") is None
    assert "workbench.no_such_part not found" in module_problem("workbench.no_such_part")
    assert "not installed" in module_problem("no_such_package_xyz.main")


def test_plan_factories_load_from_a_module_or_a_file(tmp_path: Path):
    assert load_plan_factory("workbench.supervisor.plan:plan_from_recipe") is plan_from_recipe
    source = tmp_path / "my_plan.py"
    source.write_text("def build(experiment):\n    return 'built'\n")
    assert load_plan_factory(f"{source}:build")(tmp_path) == "built"
    with pytest.raises(PlanError, match="no function 'missing'"):
        load_plan_factory(f"{source}:missing")


def test_free_ports_come_from_below_the_kernels_ephemeral_range():
    low, _ = ports.ephemeral_port_range()
    picked = {ports.free_port() for _ in range(5)}
    assert all(port < low for port in picked) or low <= 12000


def test_inference_and_the_trainer_restart_even_after_a_clean_exit(experiment: Path, no_gpu):
    """A stray SIGTERM makes the trainer checkpoint and exit 0; the runs still need it."""
    write_recipe(experiment)
    inference, trainer = plan_from_recipe(experiment).processes
    assert inference.restart.wants_restart(exit_ok=True)
    assert trainer.restart.wants_restart(exit_ok=True)


def test_the_placement_says_how_the_trainers_ranks_hold_the_base():
    assert describe_ranks(TrainerSection()) == "trainer: 1 rank, the whole base"
    assert describe_ranks(TrainerSection(nproc_per_node=4)) == (
        "trainer: 4 ranks, base sharded over them (FSDP2)"
    )
    replicated = TrainerSection(nproc_per_node=2, base_sharding="replicated")
    assert describe_ranks(replicated) == "trainer: 2 ranks, base replicated on each"
    two_nodes = TrainerSection(nproc_per_node=2, nnodes=2, rendezvous_port=29400)
    assert describe_ranks(two_nodes) == (
        "trainer: 4 ranks (2 nodes x 2), base sharded over them (FSDP2)"
    )


def test_the_trainer_meets_on_loopback_by_default_and_the_plan_says_so(experiment: Path, no_gpu):
    write_recipe(experiment)
    result = plan_from_recipe(experiment)
    trainer = result.processes[1]
    assert trainer.argv[trainer.argv.index("--rdzv-endpoint") + 1] == "127.0.0.1:0"
    assert trainer.argv[trainer.argv.index("--nnodes") + 1] == "1"
    assert "GLOO_SOCKET_IFNAME" not in trainer.env, "the launcher defaults it to lo"
    assert any("rendezvous on 127.0.0.1, a free port (loopback only" in n for n in result.notes)
    assert plan.read_rendezvous(experiment) == plan.Rendezvous("127.0.0.1", 0, 1)


def test_two_nodes_meet_at_the_interfaces_address_on_the_fixed_port(
    experiment: Path, no_gpu, monkeypatch
):
    monkeypatch.setattr(plan, "interface_names", lambda: ["lo", "eth7"])
    monkeypatch.setattr(plan, "interface_ipv4", lambda name: {"eth7": "127.0.0.1"}.get(name))
    port = ports.free_port()
    write_recipe(experiment)
    with layout.recipe_path(experiment).open("a") as recipe:
        recipe.write(f'nnodes = 2\nrendezvous_interface = "eth7"\nrendezvous_port = {port}\n')
    trainer = plan_from_recipe(experiment).processes[1]
    assert trainer.argv[trainer.argv.index("--nnodes") + 1] == "2"
    assert trainer.argv[trainer.argv.index("--rdzv-endpoint") + 1] == f"127.0.0.1:{port}"
    assert trainer.argv[trainer.argv.index("--rdzv-conf") + 1] == "node_rank=0"
    assert trainer.env["GLOO_SOCKET_IFNAME"] == trainer.env["NCCL_SOCKET_IFNAME"] == "eth7"
    assert plan.read_rendezvous(experiment) == plan.Rendezvous("127.0.0.1", port, 2)


def test_an_interface_this_machine_lacks_is_refused_naming_the_key(experiment: Path, no_gpu):
    write_recipe(experiment)
    with layout.recipe_path(experiment).open("a") as recipe:
        recipe.write('rendezvous_interface = "nosuch0"\n')
    with pytest.raises(PlanError, match=r"\[trainer\] rendezvous_interface 'nosuch0' is not a"):
        plan_from_recipe(experiment)
    assert plan.rendezvous_problems("nosuch0", 0)[0][0] == "trainer.rendezvous_interface"


def test_a_rendezvous_port_in_use_is_refused_naming_the_key():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ((key, message),) = plan.rendezvous_problems(None, port)
    assert key == "trainer.rendezvous_port" and f"port {port} on 127.0.0.1" in message


def test_several_nodes_without_a_fixed_port_are_refused_naming_the_key(experiment: Path):
    write_recipe(experiment)
    with layout.recipe_path(experiment).open("a") as recipe:
        recipe.write("nnodes = 2\n")
    with pytest.raises(PlanError, match=r"trainer.rendezvous_port: nnodes = 2 needs a fixed port"):
        plan_from_recipe(experiment)


@pytest.mark.parametrize("small", [True, False], ids=["two-cores", "more-cores"])
def test_on_two_cores_the_trainer_computes_on_one_thread_unless_told(
    experiment: Path, no_gpu, monkeypatch, small
):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(plan, "is_small_machine", lambda: small)
    write_recipe(experiment)
    _, trainer = plan_from_recipe(experiment).processes[:2]
    assert trainer.env.get("OMP_NUM_THREADS") == ("1" if small else None)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    _, trainer = plan_from_recipe(experiment).processes[:2]
    assert trainer.env["OMP_NUM_THREADS"] == "2" if small else "OMP_NUM_THREADS" not in trainer.env


@pytest.mark.parametrize("small", [True, False], ids=["two-cores", "more-cores"])
@pytest.mark.parametrize("users_nice", [None, "0", "17"])
def test_on_two_cores_vllm_yields_the_cpu_to_the_trainer(
    experiment: Path, no_gpu, monkeypatch, small, users_nice
):
    if users_nice is None:
        monkeypatch.delenv(NICE_ENV, raising=False)
    else:
        monkeypatch.setenv(NICE_ENV, users_nice)
    monkeypatch.setattr(plan, "is_small_machine", lambda: small)
    write_recipe(experiment)
    inference, trainer = plan_from_recipe(experiment).processes[:2]
    batch = int(users_nice or DEFAULT_NICE)
    # the trainer keeps the value every process takes; vLLM raises its own above it there
    assert NICE_ENV not in trainer.env
    expected = min(19, batch + INFERENCE_YIELDS_BY) if small else batch
    assert inference.env[NICE_ENV] == str(expected)
