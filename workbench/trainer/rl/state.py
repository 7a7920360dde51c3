"""What the trainer process holds (`Trainer`: the model, the runs' manager, optimizers,
checkpointer, packer and publisher) and a run's adapter copied out of it.

Apart from the loop (`trainer.py`) so that the modules the loop calls on (the Tinker work
items: `tinker_work.py`, `tinker_state.py`) take a `Trainer` without importing the loop.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from torch import nn

from workbench.config import TrainerConfig
from workbench.trainer.compute.model import RowLogprobs
from workbench.trainer.lora.layer import resolve_run_lora
from workbench.trainer.optim.per_run import MultiLoRAOptimizer, MultiLoRAScheduler
from workbench.trainer.rl.packer import Packer
from workbench.trainer.row_threads import RowThreads
from workbench.trainer.runs.checkpoint import RunCheckpointer
from workbench.trainer.runs.divergence import DivergenceWatch
from workbench.trainer.runs.manager import MultiRunManager
from workbench.trainer.runs.publisher import AdapterCopy, AdapterPublisher


@dataclass
class TinkerTally:
    """Per slot, what the run's forward_backward items summed since its last optim_step,
    for its metrics line (master)."""

    loss: dict[int, float] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)

    def forget(self, idx: int, run_id: str = "") -> None:
        self.loss.pop(idx, None)
        self.tokens.pop(idx, None)


@dataclass
class Trainer:
    config: TrainerConfig
    model: nn.Module
    manager: MultiRunManager
    optimizer: MultiLoRAOptimizer
    scheduler: MultiLoRAScheduler
    checkpointer: RunCheckpointer
    packer: Packer
    device: torch.device
    base_model: str
    # `model` as each row computes it (its `plan`); FSDP2's root when sharded.
    row_model: RowLogprobs
    base_sharded: bool = False
    divergence: DivergenceWatch = field(default_factory=DivergenceWatch)
    stop_requested: bool = False
    # On the CPU, the rows of an update computed side by side (None: one after another).
    row_threads: RowThreads | None = None
    # The master's adapter writes, done while the next update computes.
    publisher: AdapterPublisher = field(default_factory=AdapterPublisher)
    # Tinker runs' losses and tokens since their last optim_step (master).
    tinker_tally: TinkerTally = field(default_factory=TinkerTally)
    # Whether Tinker datums share rows (`tinker_packing.py`): decided by the master at its
    # first pass with Tinker datums; None until then.
    tinker_packing: bool | None = None
    # Per Tinker run (its id), the seq below which every work item is answered: where
    # the master's next look for work starts (`tinker_work.pending_items`).
    tinker_answered: dict[str, int] = field(default_factory=dict)
    # The master's threads that write a Tinker pass's answers side by side
    # (`tinker_work._write_answers`); started at their first use.
    answer_writers: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(8, thread_name_prefix="tinker-answer")
    )


def adapter_copy(trainer: Trainer, idx: int, *, buffered: bool = False) -> AdapterCopy:
    """The run's adapter at its current step, copied out of its slot and checked finite
    (`NonFiniteWeights` if not), ready to be written as `broadcast/step_N` (master only).
    `buffered`: into the publisher's buffers of the slot (for a background write; the
    slot's previous one must have been reaped), else into fresh tensors."""
    manager, section = trainer.manager, trainer.config.trainer
    rank, alpha = resolve_run_lora(manager.config[idx], section.lora.rank, section.lora.alpha)
    if buffered:
        tensors = trainer.publisher.copy_out(idx, manager.get_state_dict_for_run(idx, copy=False))
    else:
        tensors = manager.get_state_dict_for_run(idx)
    return AdapterCopy.checked(
        manager.get_run_dir(idx),
        manager.progress[idx].step,
        tensors,
        rank=rank,
        alpha=alpha,
        target_modules=section.target_modules,
        base_model=trainer.base_model,
    )
