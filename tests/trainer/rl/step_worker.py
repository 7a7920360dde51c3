"""Run the trainer under torchrun (any number of ranks) and save every run's adapter.

Usage: torchrun --nproc_per_node N step_worker.py EXPERIMENT MODEL_DIR OUT_DIR [KEY=JSON ...]
(each KEY=JSON a [trainer] setting, e.g. base_sharding=\"sharded\")
Trains until no batch is left (a run resumes from its checkpoint, if any) and writes
OUT_DIR/rank{R}.safetensors with `{run_id}/{param}` keys, OUT_DIR/rank{R}.gradients.safetensors
with the gradients the last update stepped from, same keys, and OUT_DIR/rank{R}.json with the
number of updates and the bytes of frozen base weights the rank held. `tests.helpers` is
imported from the repository root, which the tests' `torchrun` puts on PYTHONPATH.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from tests.helpers import gradients_at_each_update, iterate_published
from workbench.config import ModelSection, TrainerConfig, TrainerSection
from workbench.trainer.compute.sharding import base_parameter_bytes
from workbench.trainer.parallel import distributed
from workbench.trainer.rl.trainer import build_trainer, load_base_model


def main(experiment: Path, model_dir: Path, out: Path, settings: dict) -> None:
    dist.init_process_group("gloo")
    train_and_save(experiment, model_dir, out, settings)
    distributed.destroy_process_group()  # the trainer is gone: its group goes with it


def train_and_save(experiment: Path, model_dir: Path, out: Path, settings: dict) -> None:
    config = TrainerConfig(
        output_dir=experiment,
        model=ModelSection(base=str(model_dir)),
        trainer=TrainerSection(max_concurrent_runs=3, seq_len=24, **settings),
    )
    model = load_base_model(str(model_dir), torch.float32, torch.device("cpu"))
    trainer = build_trainer(config, model, torch.device("cpu"))
    gradients = gradients_at_each_update(trainer)
    updates = 0
    while iterate_published(trainer) == "trained":
        updates += 1
    manager = trainer.manager
    tensors = {
        f"{manager.idx_2_id[idx]}/{name}": param.detach().clone()
        for idx in manager.used_idxs
        for name, param in manager.get_named_parameters_for_run(idx)
    }
    save_file(tensors, str(out / f"rank{dist.get_rank()}.safetensors"))
    save_file(gradients, str(out / f"rank{dist.get_rank()}.gradients.safetensors"))
    held = {
        "updates": updates,
        "base_bytes": base_parameter_bytes(model),
        "sharded": trainer.base_sharded,
    }
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(held))


if __name__ == "__main__":
    settings = dict(arg.split("=", 1) for arg in sys.argv[4:])
    main(
        Path(sys.argv[1]),
        Path(sys.argv[2]),
        Path(sys.argv[3]),
        {key: json.loads(value) for key, value in settings.items()},
    )
