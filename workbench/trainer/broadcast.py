"""Weight broadcast: a run's adapter after each of its steps, as a peft adapter directory.

`run_<id>/broadcast/step_N/` gets `adapter_config.json` + `adapter_model.safetensors` in
peft's format (keys `base_model.model.<module>.lora_A.weight`), then STABLE, so both
`peft.PeftModel.from_pretrained` and vLLM's runtime LoRA loading read it as is. Old steps
are pruned (vLLM copies an adapter into memory when it loads it), keeping the last few so
an orchestrator that is still loading one never sees it vanish.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from peft import LoraConfig
from safetensors.torch import save_file

from workbench import layout

PEFT_PREFIX = "base_model.model."


def write_adapter(
    directory: Path,
    state_dict: dict[str, torch.Tensor],
    *,
    rank: int,
    alpha: float,
    target_modules: list[str],
    base_model: str,
) -> Path:
    """Write one adapter (keys relative to the base model, e.g. `model.layers.0...lora_A.weight`)."""
    with layout.staged_directory(directory) as staging:
        LoraConfig(
            r=rank,
            lora_alpha=alpha,
            target_modules=sorted(target_modules),
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
            base_model_name_or_path=base_model,
        ).save_pretrained(str(staging))
        tensors = {
            PEFT_PREFIX + key: value.detach().to("cpu", torch.float32).contiguous()
            for key, value in state_dict.items()
        }
        save_file(tensors, str(staging / "adapter_model.safetensors"), metadata={"format": "pt"})
    return directory


def prune_broadcasts(run: Path, keep: int) -> None:
    """Remove all but the newest `keep` STABLE broadcast steps (and stale staging dirs)."""
    steps = layout.list_step_dirs(layout.broadcasts_dir(run))
    stable = [path for _, path in steps if layout.is_stable(path)]
    for path in stable[:-keep] if keep > 0 else stable:
        shutil.rmtree(path, ignore_errors=True)
