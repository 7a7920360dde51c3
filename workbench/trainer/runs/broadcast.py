"""Weight broadcast: a run's adapter after each of its steps, as a peft adapter directory.

`run_<id>/broadcast/step_N/` gets `adapter_config.json` + `adapter_model.safetensors` in
peft's format (keys `base_model.model.<module>.lora_A.weight`), then STABLE, so both
`peft.PeftModel.from_pretrained` and vLLM's runtime LoRA loading read it as is. Its
`base_model_name_or_path` is where the base model loads from without workbench (for
`builtin:tiny-reverse` the cache directory); `workbench.json` keeps the recipe's name for
it. Old steps are pruned (vLLM copies an adapter into memory when it loads it), keeping the
last few so an orchestrator that is still loading one never sees it vanish.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig
from safetensors.torch import save_file

from workbench.files import layout
from workbench.models.resolve import loadable_base
from workbench.trainer.runs.divergence import check_finite

PEFT_PREFIX = "base_model.model."
WEIGHTS_FILE = "adapter_model.safetensors"
# The recipe's name of the base model lives beside adapter_config.json, not in it: peft
# warns about keys it does not know ("upgrade peft") on every load.
INFO_FILE = "workbench.json"


def write_adapter(
    directory: Path,
    state_dict: dict[str, torch.Tensor],
    *,
    rank: int,
    alpha: float,
    target_modules: list[str],
    base_model: str,
    finite_checked: bool = False,
) -> Path:
    """Write one adapter (keys relative to the base model, e.g. `model.layers.0...lora_A.weight`).

    `base_model` is the recipe's `[model] base` (`builtin:tiny-reverse`, a directory, a hub
    id); adapter_config.json names it as peft and vLLM load it (`loadable_base`).
    Raises `NonFiniteWeights` (and writes nothing) when a weight is nan or infinite: vLLM
    would serve it, and every completion of it would be garbage (`finite_checked`: the
    caller checked these very tensors).
    """
    if not finite_checked:
        check_finite(state_dict, "adapter weights")
    with layout.staged_directory(directory) as staging:
        LoraConfig(
            r=rank,
            lora_alpha=alpha,
            target_modules=sorted(target_modules),
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
            base_model_name_or_path=loadable_base(base_model),
        ).save_pretrained(str(staging))
        save_adapter_weights(staging, state_dict)
        (staging / INFO_FILE).write_text(
            json.dumps({"format": "workbench.adapter", "version": 1, "base_model": base_model})
            + "\n"
        )
    return directory


def save_adapter_weights(directory: Path, state_dict: dict[str, torch.Tensor]) -> None:
    """`adapter_model.safetensors` in peft's naming, float32 on the CPU."""
    tensors = {
        PEFT_PREFIX + key: value.detach().to("cpu", torch.float32).contiguous()
        for key, value in state_dict.items()
    }
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})


def read_adapter_info(directory: Path) -> dict[str, Any]:
    """`workbench.json` of an adapter directory; {} for one written before it existed."""
    try:
        return json.loads((directory / INFO_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def prune_broadcasts(run: Path, keep: int) -> None:
    """Remove all but the newest `keep` STABLE broadcast steps (and stale staging dirs)."""
    steps = layout.list_step_dirs(layout.broadcasts_dir(run))
    stable = [path for _, path in steps if layout.is_stable(path)]
    for path in stable[:-keep] if keep > 0 else stable:
        shutil.rmtree(path, ignore_errors=True)
