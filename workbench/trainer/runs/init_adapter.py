"""A run's adapter started from a peft LoRA adapter directory (`lora.init_from`) instead of
a fresh one: loading the adapter into the run's slot, once it is checked to fit.

The slot then computes what the adapter computes: the adapter's A fills the first rows of
the slot's A, its B (rescaled from the adapter's alpha / rank to the run's) the first
columns of B; a module the adapter does not adapt, and the rows beyond the adapter's rank,
keep the fresh initialisation, whose B is zero, so they add nothing until trained.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors.torch import load_file

from workbench.models.adapters import WEIGHTS_FILE, init_adapter_problem, read_peft_adapter
from workbench.trainer.runs.broadcast import PEFT_PREFIX
from workbench.trainer.runs.manager import MultiRunManager

logger = logging.getLogger(__name__)


def load_adapter_into_slot(
    manager: MultiRunManager, idx: int, directory: Path, run_rank: int, run_alpha: float
) -> None:
    """Write the adapter at `directory` into slot `idx`, whose run has `run_rank` and
    `run_alpha` (see the module docstring); raises ValueError naming a tensor that does not
    fit."""
    adapter = read_peft_adapter(directory)
    weights = load_file(str(directory / WEIGHTS_FILE))
    scale = (adapter.alpha / adapter.rank) / (run_alpha / run_rank)
    used = set()
    with torch.no_grad():
        for name, param in manager.get_named_parameters_for_run(idx):
            key = f"{PEFT_PREFIX}{name}.weight"
            if key not in weights:
                continue  # a module the adapter leaves alone: fresh, B zero
            used.add(key)
            tensor = weights[key].to(param.device, param.dtype)
            if name.endswith(".lora_A"):
                target, value = param[: adapter.rank], tensor
            else:
                target, value = param[:, : adapter.rank], tensor * scale
            if target.shape != value.shape:
                raise ValueError(
                    f"{directory / WEIGHTS_FILE}: {key} has shape {tuple(value.shape)}, this "
                    f"model's adapter {tuple(target.shape)} at rank {adapter.rank} (another "
                    "base model?)"
                )
            target.copy_(value)
    if not used:
        raise ValueError(
            f"{directory / WEIGHTS_FILE} holds none of this model's adapter weights (keys "
            f"such as {PEFT_PREFIX}model.layers.0.self_attn.q_proj.lora_A.weight)"
        )
    logger.info(
        "run %s starts from the adapter %s (rank %d, alpha %g, %d tensors)",
        manager.idx_2_id[idx],
        directory,
        adapter.rank,
        adapter.alpha,
        len(used),
    )


def check_init_adapter(
    directory: Path, base: str, target_modules: list[str], run_rank: int
) -> None:
    """Raise ValueError (`lora.init_from: why`) when the adapter does not fit the run: a run
    written by hand, which no preflight saw, is rejected with it. Checked only when the run
    starts from the adapter, so a run that has checkpoints of its own never depends on the
    adapter directory still being there."""
    problem = init_adapter_problem(directory, base, target_modules, run_rank)
    if problem is not None:
        raise ValueError(f"lora.init_from: {problem}")
