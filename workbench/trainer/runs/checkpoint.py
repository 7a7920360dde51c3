"""Per-run trainer checkpoints: when to write one (at the run's interval, its last step, on
shutdown and when it leaves the trainer), writing it, and resuming from it.

`run_<id>/checkpoints/step_N/trainer/` holds everything needed to continue that run exactly:

    adapter.safetensors   the run's slot parameters (full slot rank, as trained)
    optimizer.pt          the run's AdamW state
    scheduler.pt          the run's LR scheduler state
    progress.json         step, total_tokens, total_samples
    STABLE                written last

The directory is staged and renamed whole, so a SIGTERM or a full disk mid-write leaves the
previous checkpoint as the latest. Only the master rank writes; every rank restores (the
files are on a shared filesystem), so all ranks resume in the same state.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file

from workbench.files import layout
from workbench.trainer.runs.divergence import check_finite
from workbench.trainer.runs.manager import MultiRunManager, Progress

logger = logging.getLogger(__name__)
PART = "trainer"
ADAPTER_FILE = "adapter.safetensors"


def remove_killed_writes(experiment: Path) -> None:
    """Remove what a trainer killed mid-write left in every run: staged checkpoints and
    broadcasts. Called by a starting trainer (the only writer of both): a run that finished
    meanwhile is never written again, so nothing else would remove them."""
    for run in layout.list_run_dirs(experiment):
        layout.remove_staging(layout.broadcasts_dir(run))
        for _, step in layout.list_step_dirs(layout.checkpoints_dir(run)):
            layout.remove_staging(step, PART)


def _state_tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of an optimizer's state dict (AdamW: each parameter's moments and step)."""
    return {
        f"{param}.{key}": value
        for param, entries in state.get("state", {}).items()
        for key, value in entries.items()
        if isinstance(value, torch.Tensor)
    }


class PerRunState(Protocol):
    def state_dict_for_run(self, idx: int) -> dict[str, Any]: ...

    def load_state_dict_for_run(self, idx: int, state: dict[str, Any]) -> None: ...


def adapter_state_dict(directory: Path, rank: int) -> dict[str, torch.Tensor]:
    """A checkpoint's adapter as `MultiRunManager.get_state_dict_for_run` gives it (peft
    names, the run's rank): the slot holds `<module>.lora_A` [slot rank, in] and `.lora_B`
    [out, slot rank], of which the run uses the first `rank` rows of A and columns of B."""
    state = {}
    for name, tensor in load_file(str(directory / ADAPTER_FILE)).items():
        if name.endswith(".lora_A"):
            state[f"{name}.weight"] = tensor[:rank].contiguous()
        elif name.endswith(".lora_B"):
            state[f"{name}.weight"] = tensor[:, :rank].contiguous()
        else:
            raise ValueError(f"{directory / ADAPTER_FILE}: {name} is no LoRA parameter")
    return state


def write_state(
    final: Path,
    params: dict[str, torch.Tensor],
    optimizer: dict[str, Any] | None,
    scheduler: dict[str, Any] | None,
    progress: Progress,
) -> None:
    """A checkpoint directory, staged and renamed whole (STABLE last): the slot's
    parameters, the AdamW and scheduler states (left out when None), the progress."""
    with layout.staged_directory(final) as staging:
        save_file(params, str(staging / ADAPTER_FILE))
        if optimizer is not None:
            torch.save(optimizer, staging / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler, staging / "scheduler.pt")
        (staging / "progress.json").write_text(json.dumps(asdict(progress)))


def load_parameters(manager: MultiRunManager, idx: int, directory: Path) -> None:
    """A checkpoint directory's adapter.safetensors into slot `idx` (names and shapes checked)."""
    saved = load_file(str(directory / ADAPTER_FILE))
    params = dict(manager.get_named_parameters_for_run(idx))
    if set(saved) != set(params):
        raise ValueError(
            f"{directory}: checkpoint parameters do not match this trainer's adapter "
            f"(different target modules or model?); missing {sorted(set(params) - set(saved))[:3]}, "
            f"unexpected {sorted(set(saved) - set(params))[:3]}"
        )
    with torch.no_grad():
        for name, param in params.items():
            if saved[name].shape != param.shape:
                raise ValueError(
                    f"{directory}: {name} has shape {tuple(saved[name].shape)} in the "
                    f"checkpoint but {tuple(param.shape)} here (was the LoRA rank changed?)"
                )
            param.copy_(saved[name].to(param.device, param.dtype))


class RunCheckpointer:
    def __init__(
        self,
        manager: MultiRunManager,
        optimizer: PerRunState,
        scheduler: PerRunState,
        *,
        keep: int = 3,
    ):
        self.manager = manager
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.keep = keep
        self._last_saved_step: dict[int, int] = {}

    def save_if_due(self, idx: int, *, force: bool = False) -> Path | None:
        """Master only: checkpoint the run if its step has not been saved yet and either hits
        its interval or its last step, or `force` (shutdown, or the run leaving the trainer)."""
        config = self.manager.config[idx]
        step = self.manager.progress[idx].step
        if step <= self._last_saved_step.get(idx, 0):
            return None  # nothing new since the last checkpoint (or no update at all)
        interval = config.checkpoint_interval
        due = step >= config.max_steps or (interval > 0 and step % interval == 0)
        return self.save(idx) if force or due else None

    def save(self, idx: int) -> Path | None:
        """Master only: write the run's checkpoint at its current step. Raises
        `NonFiniteWeights` (and writes nothing) when its adapter or AdamW state holds a nan
        or an infinity: the run's latest checkpoint stays the last finite one."""
        manager = self.manager
        run = manager.get_run_dir(idx)
        if not run.is_dir():
            return None  # the run directory was deleted: nothing to keep it for
        progress = manager.progress[idx]
        final = layout.checkpoint_part_dir(run, progress.step, PART)
        params = {
            name: param.detach().to("cpu").contiguous()
            for name, param in manager.get_named_parameters_for_run(idx)
        }
        check_finite(params, "adapter weights")
        optimizer = self.optimizer.state_dict_for_run(idx)
        check_finite(_state_tensors(optimizer), "AdamW state")
        write_state(final, params, optimizer, self.scheduler.state_dict_for_run(idx), progress)
        self._last_saved_step[idx] = progress.step
        self._prune(run)
        logger.info("checkpoint of %s at step %d: %s", manager.idx_2_id[idx], progress.step, final)
        return final

    def restore(self, idx: int) -> int | None:
        """Load the run's latest STABLE checkpoint into its slot; returns its step or None."""
        manager = self.manager
        run = manager.get_run_dir(idx)
        step = layout.latest_checkpoint_step(run, PART)
        if step is None:
            return None
        directory = layout.checkpoint_part_dir(run, step, PART)
        load_parameters(manager, idx, directory)
        self.optimizer.load_state_dict_for_run(
            idx, torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=True)
        )
        self.scheduler.load_state_dict_for_run(
            idx, torch.load(directory / "scheduler.pt", map_location="cpu", weights_only=True)
        )
        manager.progress[idx] = Progress(**json.loads((directory / "progress.json").read_text()))
        self._last_saved_step[idx] = step
        logger.info("run %s resumed from %s", manager.idx_2_id[idx], directory)
        return step

    def forget(self, idx: int) -> None:
        self._last_saved_step.pop(idx, None)

    def _prune(self, run: Path) -> None:
        steps = [
            step
            for step, path in layout.list_step_dirs(layout.checkpoints_dir(run))
            if layout.is_stable(path / PART)
        ]
        for step in steps[: -self.keep] if self.keep > 0 else []:
            part = layout.checkpoint_part_dir(run, step, PART)
            shutil.rmtree(part, ignore_errors=True)
            step_dir = layout.checkpoint_dir(run, step)
            if step_dir.is_dir() and not any(step_dir.iterdir()):
                step_dir.rmdir()
