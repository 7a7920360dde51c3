"""Tinker work items answered by the trainer as the supervisor starts it: torchrun's agent
and two gloo ranks, a native run training beside the Tinker run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.rl.test_multi_process import experiment_with_batches
from tests.trainer.rl.test_rl_trainer import make_trainer
from tests.trainer.rl.test_tinker_work import ADAM, drain, make_datums, submit, tinker_run
from workbench.config import ModelSection, TrainerConfig, TrainerSection, model_to_toml
from workbench.files import tinker_work as tw
from workbench.trainer.parallel.launch import rendezvous_args

pytestmark = pytest.mark.slow


def items(run: Path) -> int:
    """Two forward_backward + optim_step rounds, then sampler weights; the last seq."""
    for round_ in range(2):
        submit(run, 3 * round_, "forward_backward", make_datums(50 + round_, 4), loss_fn="ppo")
        submit(run, 3 * round_ + 1, "forward", make_datums(60 + round_, 2))
        submit(run, 3 * round_ + 2, "optim_step", adam=ADAM)
    return submit(run, 6, "save_weights_for_sampler", path=str(tw.tinker_dir(run) / "s"))


def wait_result(run: Path, seq: int, process: subprocess.Popen, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while (result := tw.read_result(run, seq)) is None:
        assert process.poll() is None, f"trainer exited with {process.returncode}"
        assert time.monotonic() < deadline, f"work item {seq} of {run.name} not answered"
        time.sleep(0.1)
    return result


def test_two_ranks_answer_a_tinker_run_as_one_process_does(tmp_path, tiny_llama):
    experiment = experiment_with_batches(tmp_path / "exp", steps=2, lr=0.05)
    run = tinker_run(experiment, "run_tinker_x")
    config = TrainerConfig(
        output_dir=experiment,
        model=ModelSection(base=str(tiny_llama)),
        trainer=TrainerSection(max_concurrent_runs=3, seq_len=32, poll_interval_s=0.05),
    )
    config_path = tmp_path / "trainer.toml"
    config_path.write_text(model_to_toml(config))
    last = items(run)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    with open(tmp_path / "trainer.log", "w") as log:
        launcher = subprocess.Popen(
            [
                sys.executable, "-m", "workbench.trainer.parallel.launch", "--nproc_per_node", "2",
                *rendezvous_args(), "-m", "workbench.trainer.rl.trainer", "--config", str(config_path),
            ],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
        try:
            answered = [wait_result(run, seq, launcher) for seq in range(last + 1)]
        finally:
            os.killpg(launcher.pid, signal.SIGTERM)
            launcher.wait(timeout=120)
    assert all(result.ok for result in answered), [r.error for r in answered]
    assert answered[last].data["step"] == 2
    served = load_file(str(tw.tinker_dir(run) / "s" / "adapter_model.safetensors"))

    # The same items in one process, alone: the same answers and adapter, up to rounding
    # (the ranks' rows run with other thread counts than this process's).
    alone_exp = tmp_path / "alone"
    alone_run = tinker_run(alone_exp, "run_tinker_x")
    trainer = make_trainer(alone_exp, tiny_llama)
    items(alone_run)
    drain(trainer, alone_run, last, passes=40)
    for seq in range(last):
        mine, theirs = tw.read_result(alone_run, seq), answered[seq]
        for key, value in mine.tensors.items():
            np.testing.assert_allclose(theirs.tensors[key], value, rtol=1e-5, atol=1e-6)
    alone = load_file(str(tw.tinker_dir(alone_run) / "s" / "adapter_model.safetensors"))
    assert served.keys() == alone.keys()
    for key, tensor in alone.items():
        torch.testing.assert_close(served[key], tensor, rtol=1e-4, atol=1e-6)
