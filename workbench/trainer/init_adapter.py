"""A run's adapter started from a peft LoRA adapter directory (`lora.init_from`) instead of
a fresh one: the check the trainer makes when it discovers such a run, and loading the
adapter into the run's slot.

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

from workbench.config import OrchestratorConfig
from workbench.models.adapters import WEIGHTS_FILE, init_adapter_problem, read_peft_adapter
from workbench.trainer.broadcast import PEFT_PREFIX
from workbench.trainer.runs import MultiRunManager

logger = logging.getLogger(__name__)


def init_from_validation_hook(base: str, target_modules: list[str], slot_rank: int):
    """A config validation hook: a run whose `lora.init_from` does not fit is rejected with
    the reason (a run added by hand, which no preflight saw)."""

    def validate(config: OrchestratorConfig) -> tuple[bool, str]:
        if config.lora.init_from is None:
            return True, ""
        problem = init_adapter_problem(
            Path(config.lora.init_from), base, target_modules, config.lora.rank or slot_rank
        )
        return problem is None, f"lora.init_from: {problem}" if problem else ""

    return validate


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
