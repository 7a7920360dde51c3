"""Run one trainer update under torchrun (any number of ranks) and save every run's adapter.

Usage: torchrun --nproc_per_node N step_worker.py EXPERIMENT MODEL_DIR OUT_DIR
Writes OUT_DIR/rank{R}.safetensors with `{run_id}/{param}` keys.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from workbench.config import ModelSection, TrainerConfig, TrainerSection
from workbench.trainer.rl import build_trainer, iterate, load_base_model


def main(experiment: Path, model_dir: Path, out: Path) -> None:
    dist.init_process_group("gloo")
    config = TrainerConfig(
        output_dir=experiment,
        model=ModelSection(base=str(model_dir)),
        trainer=TrainerSection(max_concurrent_runs=3, seq_len=24),
    )
    model = load_base_model(str(model_dir), torch.float32, torch.device("cpu"))
    trainer = build_trainer(config, model, torch.device("cpu"))
    outcomes = [iterate(trainer) for _ in range(2)]
    assert outcomes == ["trained", "idle"], outcomes
    manager = trainer.manager
    tensors = {
        f"{manager.idx_2_id[idx]}/{name}": param.detach().clone()
        for idx in manager.used_idxs
        for name, param in manager.get_named_parameters_for_run(idx)
    }
    save_file(tensors, str(out / f"rank{dist.get_rank()}.safetensors"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
