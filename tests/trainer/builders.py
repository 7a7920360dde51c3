"""Small builders for the trainer tests: a tiny Llama, a trainer over real run directories,
and packed forward passes."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers

from tests.helpers import make_run
from workbench.files import layout
from workbench.trainer.lora.layer import (
    LoRAPath,
    MultiLoRALinear,
    apply_lora_to_model,
    set_lora_num_tokens,
)
from workbench.trainer.optim.per_run import MultiLoRAOptimizer, MultiLoRAScheduler
from workbench.trainer.runs.manager import MultiRunManager

# Device-parametrised tests also run on CUDA where a GPU is present, skipped elsewhere.
NEEDS_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=NEEDS_GPU)]
# (device, dtype): float32 everywhere, and bf16, the dtype a GPU trains in, on CUDA.
DEVICE_DTYPES = [
    ("cpu", torch.float32),
    pytest.param("cuda", torch.float32, marks=NEEDS_GPU),
    pytest.param("cuda", torch.bfloat16, marks=NEEDS_GPU),
]

TINY_SHAPE = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 64,
}
# Qwen2 has biases on q/k/v; Qwen3 has q/k norms and an explicit head_dim.
FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}


def tiny_causal_lm(
    family: str = "llama", seed: int = 0, head_dim: int = 8
) -> transformers.PreTrainedModel:
    """A random float32 causal LM of the family, built from its config (nothing downloaded).

    Heads of 8 keep the CPU tests fast; CUDA's flex kernel needs at least 16."""
    config_class, model_class = FAMILIES[family]
    torch.manual_seed(seed)
    return model_class(config_class(**TINY_SHAPE, head_dim=head_dim)).float()


def tiny_llama(seed: int = 0) -> transformers.LlamaForCausalLM:
    return tiny_causal_lm("llama", seed)


def write_runs(experiment: Path, runs: dict[str, str]) -> None:
    """Run directories whose configs look written in dict order (the manager admits FIFO)."""
    base_ns = 1_700_000_000_000_000_000
    for i, (run_id, orch_toml) in enumerate(runs.items()):
        run = make_run(experiment, run_id, orch_toml)
        stamp = base_ns + i * 1_000_000_000
        os.utime(layout.orch_config_path(run), ns=(stamp, stamp))


@dataclass
class TinyTrainer:
    manager: MultiRunManager
    model: transformers.PreTrainedModel
    optimizer: MultiLoRAOptimizer
    scheduler: MultiLoRAScheduler
    lora_layers: list[str]

    def refresh(self) -> None:
        self.manager.discover_runs()
        self.manager.synchronize_state()

    def slot(self, run_id: str) -> int:
        return self.manager.id_2_idx[run_id]


def build_trainer(
    experiment: Path,
    runs: dict[str, str],
    *,
    max_runs: int | None = None,
    rank: int = 8,
    alpha: float = 16.0,
    path: LoRAPath = "auto",
    family: str = "llama",
    model_seed: int = 0,
    head_dim: int = 8,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> TinyTrainer:
    """The trainer's set-up order: manager, model on its device, LoRA layers, optimizer,
    scheduler, then runs."""
    experiment.mkdir(parents=True, exist_ok=True)
    write_runs(experiment, runs)
    manager = MultiRunManager(experiment, max_runs or max(1, len(runs)))
    model = tiny_causal_lm(family, model_seed, head_dim).to(device, dtype)
    layers = apply_lora_to_model(model, manager, rank, alpha, path=path)
    optimizer = MultiLoRAOptimizer(manager)
    scheduler = MultiLoRAScheduler(optimizer)
    trainer = TinyTrainer(manager, model, optimizer, scheduler, layers)
    trainer.refresh()
    return trainer


def packed_inputs(samples: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and position_ids [1, T] of samples packed in one row, positions restarting."""
    input_ids = torch.cat(list(samples))[None]
    position_ids = torch.cat([torch.arange(len(s)) for s in samples])[None]
    return input_ids, position_ids


def packed_logits(
    model: torch.nn.Module, samples: Sequence[torch.Tensor], lora_num_tokens: Sequence[int]
) -> torch.Tensor:
    """Logits [1, T, V] of a packed row. `use_cache=False` matters: with a cache object
    transformers 5.19 ignores the restarting position_ids and lets samples attend across."""
    device = next(model.parameters()).device
    input_ids, position_ids = (t.to(device) for t in packed_inputs(samples))
    set_lora_num_tokens(model, torch.tensor(list(lora_num_tokens)))
    return model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits


def load_state_dict_for_run(
    model: torch.nn.Module, idx: int, state_dict: dict[str, torch.Tensor]
) -> None:
    """Put a state dict from `manager.get_state_dict_for_run(idx)` (or peft's, without its
    prefix) into slot `idx`, layer by layer: how these tests give a slot chosen weights. The
    tensors must have the run's rank (the trainer itself restores whole slots from checkpoints)."""
    by_module: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state_dict.items():
        module_name, _, param_key = key.rpartition(".lora_")
        by_module.setdefault(module_name, {})["lora_" + param_key] = tensor
    for name, entries in by_module.items():
        module = model.get_submodule(name)
        if not isinstance(module, MultiLoRALinear):
            raise TypeError(f"{name} is a {type(module).__name__}, not a MultiLoRALinear")
        load_adapter_into_slot(module, idx, entries["lora_A.weight"], entries["lora_B.weight"])


def load_adapter_into_slot(
    layer: MultiLoRALinear, idx: int, lora_a: torch.Tensor, lora_b: torch.Tensor
) -> None:
    """A run-rank adapter (A [r, in], B [out, r]) into slot `idx`; the slot's padding is zeroed."""
    rank = lora_a.shape[0]
    with torch.no_grad():
        layer.lora_A[idx].zero_()
        layer.lora_B[idx].zero_()
        layer.lora_A[idx][:rank].copy_(lora_a)
        layer.lora_B[idx][:, :rank].copy_(lora_b)
