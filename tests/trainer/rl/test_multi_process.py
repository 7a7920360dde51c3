"""The trainer as real processes: two torchrun ranks, and a kill -9 in the middle of a run."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import assert_same_gradients, iterate_published, make_run, random_batch
from workbench.config import ModelSection, TrainerConfig, TrainerSection, model_to_toml
from workbench.files import layout
from workbench.files.rollouts import write_rollouts
from workbench.system.ports import free_port
from workbench.trainer.rl.trainer import build_trainer, load_base_model

WORKER = Path(__file__).with_name("step_worker.py")


def experiment_with_batches(root: Path, steps: int, **orch) -> Path:
    experiment = root
    orch_toml = "".join(f"{key} = {value}\n" for key, value in orch.items())
    for name, seed in (("run_a", 1), ("run_b", 2)):
        run = make_run(experiment, name, orch_toml)
        for step in range(steps):
            write_rollouts(run, random_batch(name, step, 10, seed=seed))
    return experiment


REPOSITORY = Path(__file__).parents[3]


def worker_environment() -> dict[str, str]:
    """This environment, with the repository root on PYTHONPATH: the step worker imports
    `tests.helpers`."""
    pythonpath = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": pythonpath}


def torchrun(nproc: int, *args: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=worker_environment(),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]


@pytest.mark.parametrize("base_sharding", ["replicated", "sharded"])
def test_two_ranks_train_the_same_adapters_as_one_rank_with_the_whole_batch(
    tmp_path, tiny_llama, base_sharding
):
    two = experiment_with_batches(tmp_path / "two", steps=1, lr=0.05)
    one = experiment_with_batches(tmp_path / "one", steps=1, lr=0.05)
    (tmp_path / "out2").mkdir()
    (tmp_path / "out1").mkdir()
    setting = f'base_sharding="{base_sharding}"'
    torchrun(2, str(WORKER), str(two), str(tiny_llama), str(tmp_path / "out2"), setting)
    torchrun(1, str(WORKER), str(one), str(tiny_llama), str(tmp_path / "out1"))
    assert_two_ranks_trained_as_one(tmp_path / "out2", tmp_path / "out1")


def assert_two_ranks_trained_as_one(two: Path, one: Path) -> None:
    """The step worker's adapters of ranks 0 and 1 under `two` are equal to each other, and
    their update stepped from the gradients of the single rank's under `one`, within the
    rounding of float32 sums in another order (two ranks' gradients all-reduced against one
    rank's accumulated)."""
    rank0 = load_file(str(two / "rank0.safetensors"))
    rank1 = load_file(str(two / "rank1.safetensors"))
    alone = load_file(str(one / "rank0.safetensors"))
    assert set(rank0) == set(alone) and any(k.startswith("run_b/") for k in alone)
    for key in alone:
        torch.testing.assert_close(rank0[key], rank1[key], rtol=0, atol=0)
    assert_same_gradients(
        load_file(str(two / "rank0.gradients.safetensors")),
        load_file(str(one / "rank0.gradients.safetensors")),
    )
    changed = [k for k in alone if "lora_B" in k and alone[k].abs().max() > 0]
    assert changed, "B starts at zero: a trained adapter must have moved it"


def write_trainer_config(
    tmp_path: Path, experiment: Path, tiny_llama: Path
) -> tuple[TrainerConfig, Path]:
    """Two slots, short rows and a fast poll: `tmp_path/trainer.toml`."""
    config = TrainerConfig(
        output_dir=experiment,
        model=ModelSection(base=str(tiny_llama)),
        trainer=TrainerSection(max_concurrent_runs=2, seq_len=32, poll_interval_s=0.05),
    )
    config_path = tmp_path / "trainer.toml"
    config_path.write_text(model_to_toml(config))
    return config, config_path


def wait_for(path: Path, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not layout.is_stable(path):
        assert process.poll() is None, f"trainer exited with {process.returncode}"
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.1)


def test_killed_trainer_resumes_each_run_from_its_checkpoint_with_identical_state(
    tmp_path, tiny_llama
):
    experiment = experiment_with_batches(tmp_path / "exp", steps=2, lr=0.05, checkpoint_interval=1)
    config, config_path = write_trainer_config(tmp_path, experiment, tiny_llama)
    command = [sys.executable, "-m", "workbench.trainer.rl.trainer", "--config", str(config_path)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    log = open(tmp_path / "trainer.log", "w")  # noqa: SIM115 - closed at the end of the test
    first = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    for run in ("run_a", "run_b"):
        wait_for(layout.checkpoint_part_dir(experiment / run, 2, "trainer"), first)
    first.send_signal(signal.SIGKILL)
    first.wait()

    for name, seed in (("run_a", 1), ("run_b", 2)):
        write_rollouts(experiment / name, random_batch(name, 2, 10, seed=seed))
    second = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    for run in ("run_a", "run_b"):
        wait_for(layout.checkpoint_part_dir(experiment / run, 3, "trainer"), second)
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=60) == 0
    log.close()
    assert "resumes at step 2" in (tmp_path / "trainer.log").read_text()

    # The same three batches without the kill, in this process.
    reference = experiment_with_batches(tmp_path / "ref", steps=3, lr=0.05, checkpoint_interval=1)
    ref_config = config.model_copy(update={"output_dir": reference})
    trainer = build_trainer(
        ref_config,
        load_base_model(str(tiny_llama), torch.float32, torch.device("cpu")),
        torch.device("cpu"),
    )
    assert [iterate_published(trainer) for _ in range(4)] == [
        "trained",
        "trained",
        "trained",
        "idle",
    ]
    for name in ("run_a", "run_b"):
        idx = trainer.manager.id_2_idx[name]
        assert trainer.manager.progress[idx].step == 3
        resumed = load_file(
            str(layout.checkpoint_part_dir(experiment / name, 3, "trainer") / "adapter.safetensors")
        )
        for key, param in trainer.manager.get_named_parameters_for_run(idx):
            torch.testing.assert_close(resumed[key], param.detach(), rtol=1e-6, atol=1e-7)
        saved_opt = torch.load(
            layout.checkpoint_part_dir(experiment / name, 3, "trainer") / "optimizer.pt",
            weights_only=True,
        )
        ref_opt = trainer.optimizer.state_dict_for_run(idx)
        for key, state in ref_opt["state"].items():
            torch.testing.assert_close(
                saved_opt["state"][key]["exp_avg"], state["exp_avg"], rtol=1e-6, atol=1e-7
            )


def test_a_checkpoint_without_its_broadcast_is_published_when_the_run_resumes(tmp_path, tiny_llama):
    # A SIGTERM between an update and its broadcast checkpoints the step the orchestrator
    # never received: the orchestrator waits for that version, so resuming must publish it.
    experiment = experiment_with_batches(tmp_path / "exp", steps=2, lr=0.05, checkpoint_interval=1)
    config, _ = write_trainer_config(tmp_path, experiment, tiny_llama)

    def trainer():
        model = load_base_model(str(tiny_llama), torch.float32, torch.device("cpu"))
        return build_trainer(config, model, torch.device("cpu"))

    first = trainer()
    assert [iterate_published(first) for _ in range(3)] == ["trained", "trained", "idle"]
    lost = layout.broadcast_dir(experiment / "run_a", 2)
    shutil.rmtree(lost)

    second = trainer()
    assert iterate_published(second) == "idle"
    assert layout.is_stable(lost)
    published = load_file(str(lost / "adapter_model.safetensors"))
    kept = load_file(
        str(layout.broadcast_dir(experiment / "run_b", 2) / "adapter_model.safetensors")
    )
    assert published.keys() == kept.keys()
    idx = second.manager.id_2_idx["run_a"]
    assert second.manager.progress[idx].step == 2
    # peft's names prefix the manager's (`base_model.model.`): match each by its ending.
    for key, value in second.manager.get_state_dict_for_run(idx).items():
        (name,) = [name for name in published if name.endswith(key)]
        torch.testing.assert_close(published[name], value.detach())
