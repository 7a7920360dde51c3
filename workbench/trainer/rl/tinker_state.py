"""A Tinker run's save_state / load_state / save_weights_for_sampler work items.

save_state writes the item's `path` in the format of the trainer's own checkpoints
(`workbench.trainer.runs.checkpoint`: adapter.safetensors of the slot, optimizer.pt when
asked, progress.json, STABLE last), so a state saved by one run loads into another
(`create_training_client_from_state`). load_state puts a state into the slot; without the
optimizer the run's AdamW starts afresh, as Tinker's `load_state` does. Either way the
run's pending gradients are dropped, and its step goes up by one: the weights are a new
version, whose sampler weights must not be taken for the old step's `broadcast/step_N`.

save_weights_for_sampler publishes the adapter as `broadcast/step_N` (N the run's step;
kept as it is when this version was published already) for vLLM to load as `run@N`, and
writes the same adapter into the item's `path`, which never changes afterwards. It copies
the adapter at once and leaves the writes to its caller, who does a pass's writes side by
side (`tinker_work._write_answers`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from workbench.files import layout
from workbench.trainer.runs.checkpoint import load_parameters, write_state

if TYPE_CHECKING:
    from workbench.trainer.rl.state import Trainer

OPTIMIZER_FILE = "optimizer.pt"


def save_state(trainer: Trainer, idx: int, path: Path, with_optimizer: bool) -> None:
    """Master: the run's slot (and AdamW state) into `path`, whole or not at all."""
    if not trainer.manager.is_master:
        return
    if path.exists():
        raise ValueError(f"{path} exists: a saved state is never written over")
    manager = trainer.manager
    params = {
        name: param.detach().to("cpu").contiguous()
        for name, param in manager.get_named_parameters_for_run(idx)
    }
    optimizer = trainer.optimizer.state_dict_for_run(idx) if with_optimizer else None
    write_state(path, params, optimizer, None, manager.progress[idx])


def load_state(trainer: Trainer, idx: int, path: Path, with_optimizer: bool) -> None:
    """Every rank: `path`'s adapter (and AdamW state, if asked and saved) into the slot."""
    if not layout.is_stable(path):
        raise ValueError(f"{path} is no saved state (no STABLE)")
    optimizer_file = path / OPTIMIZER_FILE
    if with_optimizer and not optimizer_file.is_file():
        raise ValueError(f"{path} was saved without its optimizer state")
    manager = trainer.manager
    load_parameters(manager, idx, path)
    if with_optimizer:
        state = torch.load(optimizer_file, map_location="cpu", weights_only=True)
        trainer.optimizer.load_state_dict_for_run(idx, state)
    else:
        trainer.optimizer.optimizer_creation_hook(idx, manager.idx_2_id[idx])
    for _, param in manager.get_named_parameters_for_run(idx):
        param.grad = None
    manager.progress[idx].step += 1


def save_for_sampler(trainer: Trainer, idx: int, path: Path) -> tuple[dict, Callable[[], None]]:
    """Master: the answer, which names `broadcast/step_N` and `path`, and the writes of both
    (`broadcast/step_N` only if not there yet) from a copy of the adapter taken now: the
    caller may write them after the run's next ops have changed its slot."""
    from workbench.trainer.rl.state import adapter_copy

    manager = trainer.manager
    step = manager.progress[idx].step
    run_id = manager.idx_2_id[idx]
    broadcast = layout.broadcast_dir(manager.get_run_dir(idx), step)
    answer = {"path": str(path), "step": step, "adapter": f"{run_id}@{step}"}
    if not manager.is_master:
        return answer, _nothing
    if path.exists():
        raise ValueError(f"{path} exists: sampler weights are never written over")
    copy = adapter_copy(trainer, idx)

    def write() -> None:
        if not layout.is_stable(broadcast):
            copy.write()
        copy.write_to(path)

    return {**answer, "broadcast": str(broadcast)}, write


def _nothing() -> None:
    pass
