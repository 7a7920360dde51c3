"""Writing an export: the chosen adapter in peft's layout and its README.md, built under a
temporary name beside the output and renamed into place whole (`layout.staged_directory`),
so an export that fails leaves nothing behind and one that exists is complete."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError, safe_open

from workbench.export.card import CARD_FILE, model_card
from workbench.export.selection import Choice, ExportError, KeptAdapter, Which, choose_adapter
from workbench.files import layout
from workbench.trainer.runs.broadcast import WEIGHTS_FILE, save_adapter_weights
from workbench.trainer.runs.checkpoint import adapter_state_dict

CONFIG_FILE = "adapter_config.json"


@dataclass(frozen=True)
class Exported:
    path: Path
    choice: Choice


def export_adapter(run: Path, output: Path, which: Which = "best") -> Exported:
    """Copy the run's best or latest kept adapter to `output` (a new directory) with a
    model card. ExportError when the run has no complete adapter or `output` exists."""
    if output.exists():
        raise ExportError(
            f"{output} already exists; choose a new output directory (-o) or remove it",
            exit_code=2,
        )
    choice = choose_adapter(run, which)
    source = choice.adapter
    try:
        with layout.staged_directory(output) as staging:
            if source.kind == "broadcast":
                _copy_files(source.path, staging)
            else:
                _convert_checkpoint(run, source, staging)
            (staging / CARD_FILE).write_text(
                model_card(run, choice, staging, output), encoding="utf-8"
            )
    except FileNotFoundError as err:
        raise ExportError(
            f"{run.name}: {err.filename} vanished while it was copied (the trainer prunes "
            "old adapters while the run trains); export again"
        ) from None
    except (SafetensorError, ValueError) as err:
        raise ExportError(f"{run.name}: {source.path} cannot be read: {err}") from None
    return Exported(output, choice)


def _copy_files(source: Path, target: Path, *, skip: tuple[str, ...] = ()) -> None:
    """Every file of an adapter directory but its STABLE marker (the export gets its own)."""
    for entry in source.iterdir():
        if entry.is_file() and entry.name not in (layout.STABLE, *skip):
            shutil.copy2(entry, target / entry.name)


def _convert_checkpoint(run: Path, source: KeptAdapter, target: Path) -> None:
    """A trainer checkpoint in peft's layout, with the settings (rank, alpha, target modules,
    base model) of the run's newest broadcast: they are the run's for all its steps."""
    newest = layout.latest_stable_step(layout.broadcasts_dir(run))
    if newest is None:
        raise ExportError(
            f"{run.name}: its step {source.step} is kept only as a trainer checkpoint, and "
            "no broadcast/step_N is left to read its adapter settings (rank, alpha, target "
            "modules) from; the trainer keeps the last 3, so broadcast/ was removed by hand"
        )
    template = layout.broadcast_dir(run, newest)
    _copy_files(template, target, skip=(WEIGHTS_FILE,))
    config = json.loads((target / CONFIG_FILE).read_text(encoding="utf-8"))
    save_adapter_weights(target, adapter_state_dict(source.path, rank=config["r"]))
    with (
        safe_open(str(template / WEIGHTS_FILE), "pt") as a,
        safe_open(str(target / WEIGHTS_FILE), "pt") as b,
    ):
        if set(a.keys()) != set(b.keys()):
            raise ValueError(f"its tensors are not those of {template} (other target modules?)")
