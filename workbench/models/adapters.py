"""Reading a peft LoRA adapter directory that a run starts from (`lora.init_from`), and
whether it fits the experiment: its base model, its target modules and its rank.

The directories this takes are peft's: `adapter_config.json` and
`adapter_model.safetensors` (keys `base_model.model.<module>.lora_{A,B}.weight`), as
`workbench export`, `workbench sft --lora`, a run's `broadcast/step_N/` and peft's own
`save_pretrained` write them. Which base model an adapter belongs to is read from
`workbench.json` (the recipe's name, written beside every adapter workbench writes),
`sft_summary.json` (`workbench sft`'s config) and `base_model_name_or_path`, any of which
may name the experiment's base as the recipe does or as it loads (`loadable_base`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.models.resolve import loadable_base

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
SOURCES = (
    "a directory `workbench export` or `workbench sft --lora` wrote, or a run's broadcast/step_N"
)


class AdapterError(ValueError):
    """An adapter directory that cannot be read as a peft LoRA adapter; says why."""


@dataclass(frozen=True)
class PeftAdapter:
    directory: Path
    rank: int
    alpha: float
    target_modules: frozenset[str]
    base_names: tuple[str, ...]  # what its files say its base model is, first the clearest


def read_peft_adapter(directory: Path) -> PeftAdapter:
    """The adapter's shape and base; raises AdapterError when it is not a peft LoRA adapter
    workbench can start a run from."""
    if not directory.is_dir():
        raise AdapterError(f"{directory} is not a directory; give {SOURCES}")
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE) if not (directory / name).is_file()]
    if missing:
        raise AdapterError(
            f"{directory} is not a peft adapter directory (no {' or '.join(missing)}); "
            f"give {SOURCES}"
        )
    config = _read_json(directory / CONFIG_FILE)
    if config is None:
        raise AdapterError(f"{directory / CONFIG_FILE} is not a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{directory} holds a {config.get('peft_type')} adapter, not LoRA")
    unsupported = [
        key
        for key in ("rank_pattern", "alpha_pattern", "use_rslora", "use_dora")
        if config.get(key)
    ]
    if unsupported:
        raise AdapterError(
            f"{directory}: {', '.join(unsupported)} set in {CONFIG_FILE}; workbench's adapters "
            "have one rank and alpha for every module and plain LoRA scaling (alpha / rank)"
        )
    modules = config.get("target_modules")
    if isinstance(modules, str) or not modules:
        raise AdapterError(
            f"{directory}: target_modules in {CONFIG_FILE} is {modules!r}; workbench needs "
            "the list of module names it adapts"
        )
    return PeftAdapter(
        directory=directory,
        rank=int(config.get("r", 8)),
        alpha=float(config.get("lora_alpha", 8)),
        target_modules=frozenset(modules),
        base_names=_base_names(directory, config),
    )


def init_adapter_problem(
    directory: Path, base: str, target_modules: list[str], run_rank: int
) -> str | None:
    """Why a run of this base model, these trainer target modules and this rank (its own
    `lora.rank`, else the trainer's) cannot start from the adapter at `directory`, or None."""
    try:
        adapter = read_peft_adapter(directory)
    except AdapterError as err:
        return str(err)
    if not _same_base(adapter.base_names, base):
        named = adapter.base_names[0] if adapter.base_names else "no base model"
        return (
            f"{directory} is an adapter of {named}, not of this experiment's base model "
            f"{base}; an adapter only fits the base it was trained on"
        )
    extra = sorted(adapter.target_modules - set(target_modules))
    if extra:
        return (
            f"{directory} adapts {', '.join(extra)}, which the trainer's adapters do not "
            f"([trainer] target_modules = {sorted(target_modules)}); add them there"
        )
    if adapter.rank > run_rank:
        return (
            f"{directory} has rank {adapter.rank}, more than this run's {run_rank} (its "
            f"lora.rank, else [trainer] lora.rank); give the run a rank of at least "
            f"{adapter.rank}"
        )
    return None


def _base_names(directory: Path, config: dict[str, Any]) -> tuple[str, ...]:
    names = []
    info = _read_json(directory / "workbench.json") or {}
    summary = _read_json(directory / "sft_summary.json") or {}
    for name in (
        info.get("base_model"),
        (summary.get("config") or {}).get("model"),
        config.get("base_model_name_or_path"),
    ):
        if isinstance(name, str) and name and name not in names:
            names.append(name)
    return tuple(names)


def _same_base(names: tuple[str, ...], base: str) -> bool:
    wanted = {base, loadable_base(base)}
    for name in names:
        if name in wanted:
            return True
        local = Path(name).expanduser()
        if local.is_dir() and str(local.resolve()) in wanted:
            return True
    return False


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None
