"""Per-run optimizers and learning-rate schedules for the shared multi-LoRA trainer.

As in prime-rl's `MultiLoRAOptimizer` / `MultiLoRAScheduler`: every run gets its
own AdamW over its own adapter parameters, made by a manager creation hook and dropped by a
deletion hook, and its own schedule. `step()` touches only the runs with data this step
(`manager.ready_to_update_idxs`): on a GPU all of them in one set of foreach calls
(`workbench.trainer.optim.multi_adamw`), on the CPU each with torch's fused AdamW (`fused_on`).
Each run's gradient is clipped by its own norm with its own `max_norm`, so a run with a
huge loss cannot shrink another run's update: that, the per-run loss normalisation
(`loss.py`) and the separate parameters are what keep runs isolated.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import AdamW, Optimizer
from torch.optim.lr_scheduler import LambdaLR

from workbench.config import SchedulerConfig
from workbench.trainer.optim.multi_adamw import (
    adamw_step_together,
    clip_grad_norms_together,
    steps_together,
)
from workbench.trainer.runs.manager import MultiRunManager

logger = logging.getLogger(__name__)

PostCreationCallback = Callable[[Optimizer, int], None]


class MultiLoRAOptimizer:
    """One AdamW per run slot (`optimizers[idx]`, None for a free slot)."""

    def __init__(self, manager: MultiRunManager):
        self.manager = manager
        self.optimizers: list[AdamW | None] = [None] * manager.max_runs
        self._post_creation_callbacks: list[PostCreationCallback] = []
        manager.register_creation_hook(self.optimizer_creation_hook)
        manager.register_deletion_hook(self.optimizer_deletion_hook)
        # Runs synchronised before this optimizer existed get theirs now.
        for idx in manager.used_idxs:
            self.optimizer_creation_hook(idx, manager.idx_2_id[idx])

    def register_post_creation_callback(self, callback: PostCreationCallback) -> None:
        """Called as `callback(optimizer, idx)` after each run's optimizer is made (schedulers)."""
        self._post_creation_callbacks.append(callback)
        for idx, optimizer in enumerate(self.optimizers):
            if optimizer is not None:
                callback(optimizer, idx)

    def optimizer_creation_hook(self, idx: int, run_id: str) -> None:
        config = self.manager.config[idx]
        params = [param for _, param in self.manager.get_named_parameters_for_run(idx)]
        if not params:
            raise RuntimeError(
                f"run {run_id} has no adapter parameters: apply_lora_to_model must run before "
                "runs are synchronised"
            )
        self.optimizers[idx] = AdamW(
            params,
            lr=config.lr,
            betas=config.optim.betas,
            eps=config.optim.eps,
            weight_decay=config.optim.weight_decay,
            fused=fused_on(params[0].device),
        )
        for callback in self._post_creation_callbacks:
            callback(self.optimizers[idx], idx)

    def optimizer_deletion_hook(self, idx: int, run_id: str) -> None:
        self.optimizers[idx] = None

    def clip_grad_norms(self, idxs: list[int]) -> dict[int, float]:
        """Clip each run's gradient to its own `optim.max_norm`; return the norms before.
        All runs at once, in one host sync (`multi_adamw.clip_grad_norms_together`)."""
        params = {
            idx: [param for _, param in self.manager.get_named_parameters_for_run(idx)]
            for idx in idxs
        }
        max_norms = {idx: self.manager.config[idx].optim.max_norm for idx in idxs}
        return clip_grad_norms_together(params, max_norms)

    def step(self) -> dict[int, float]:
        """Clip and step every run ready to update; return each one's gradient norm.

        A run whose gradient is not finite skips its update (its norm comes back as
        inf or nan, for the training loop to report or evict); the others still step:
        a fused one (the CPU's, `fused_on`) on its own, the rest together
        (`multi_adamw.adamw_step_together`: what each run's AdamW.step() gives, in one set
        of foreach calls for all of them).
        """
        ready = [
            idx for idx in self.manager.ready_to_update_idxs if self.optimizers[idx] is not None
        ]
        norms = self.clip_grad_norms(ready)
        together = []
        for idx in ready:
            optimizer = self._optimizer(idx)
            if not math.isfinite(norms[idx]):
                logger.warning(
                    "run %s: gradient norm is %s, update skipped",
                    self.manager.idx_2_id.get(idx, idx),
                    norms[idx],
                )
            elif steps_together(optimizer):
                together.append(optimizer)
            else:
                optimizer.step()
        adamw_step_together(together)
        for optimizer in together:
            # What AdamW.step() would have noted for its LR scheduler, which otherwise warns
            # that it stepped before its optimizer.
            optimizer._opt_called = True  # type: ignore[attr-defined]
        return norms

    def zero_grad(self, keep: Iterable[int] = ()) -> None:
        """Drop the gradients of every slot, including slots no run holds, but those of
        `keep` (Tinker runs, whose gradients add up until their client's optim_step)."""
        kept = set(keep)
        for idx in range(self.manager.max_runs):
            if idx in kept:
                continue
            for _, param in self.manager.get_named_parameters_for_run(idx):
                param.grad = None

    def get_lr(self, idx: int) -> float:
        return self._optimizer(idx).param_groups[0]["lr"]

    def state_dict_for_run(self, idx: int) -> dict[str, Any]:
        return self._optimizer(idx).state_dict()

    def load_state_dict_for_run(self, idx: int, state_dict: dict[str, Any]) -> None:
        """The checkpoint's moments and step counts, under the run's own settings: a run
        started from another run's checkpoint with other `optim` values trains with its
        own (for a run resuming its own checkpoint they are the same)."""
        optimizer = self._optimizer(idx)
        optimizer.load_state_dict(state_dict)
        optim = self.manager.config[idx].optim
        for group in optimizer.param_groups:
            group.update(betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay)
            # How to step is this device's choice, not the checkpoint's.
            group["fused"] = fused_on(group["params"][0].device)

    def _optimizer(self, idx: int) -> AdamW:
        optimizer = self.optimizers[idx]
        if optimizer is None:
            raise KeyError(f"slot {idx} holds no run, so it has no optimizer")
        return optimizer


def fused_on(device: torch.device) -> bool | None:
    """Whether a run's AdamW steps with torch's fused kernel on `device`.

    On the CPU, yes: one pass over each tensor instead of the eight foreach operations of
    `multi_adamw.adamw_step_together`, whose cost per tensor grows with the runs (the
    optimizer part of a 64-run update of the built-in model, clipping included: 0.058 s
    against 0.157 s, one thread, `scripts/optimizer_step_bench.py`, docs/benchmarks/many-runs.md).
    On a GPU None: the runs step together in a handful of
    foreach kernels, whatever their number; the fused kernel, one launch set per run, has
    not been measured against that there. The two give the same update up to rounding,
    and a run steps the same way whether it shares the trainer or not."""
    return True if device.type == "cpu" else None


def lr_factor(config: SchedulerConfig, step: int, max_steps: int) -> float:
    """Multiplier of the base learning rate for the update after `step` completed updates.

    Warmup rises linearly to 1 over `warmup_steps` updates (the first uses
    1 / warmup_steps); then "constant" stays at 1 and "linear" / "cosine" decay from 1
    towards `min_lr_ratio`, which they reach at update `max_steps` (one past the run's
    last, as in Hugging Face's schedules, so the last update still moves the weights).
    """
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.kind == "constant":
        return 1.0
    decay_steps = max_steps - config.warmup_steps
    progress = min(1.0, (step - config.warmup_steps) / decay_steps) if decay_steps > 0 else 1.0
    if config.kind == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * shape


class MultiLoRAScheduler:
    """One LambdaLR per run, following the run's own `[scheduler]`, `lr` and `max_steps`."""

    def __init__(self, optimizer: MultiLoRAOptimizer):
        self.manager = optimizer.manager
        self.schedulers: list[LambdaLR | None] = [None] * self.manager.max_runs
        self.manager.register_deletion_hook(self.scheduler_deletion_hook)
        optimizer.register_post_creation_callback(self.scheduler_creation_hook)

    def scheduler_creation_hook(self, optimizer: Optimizer, idx: int) -> None:
        config = self.manager.config[idx]
        scheduler_config, max_steps = config.scheduler, config.max_steps
        self.schedulers[idx] = LambdaLR(
            optimizer, lambda step: lr_factor(scheduler_config, step, max_steps)
        )

    def scheduler_deletion_hook(self, idx: int, run_id: str) -> None:
        self.schedulers[idx] = None

    def step(self) -> None:
        """Advance the schedule of every run that stepped its optimizer."""
        for idx in self.manager.ready_to_update_idxs:
            scheduler = self.schedulers[idx]
            if scheduler is not None:
                scheduler.step()

    def get_last_lr(self, idx: int) -> float:
        return self._scheduler(idx).get_last_lr()[0]

    def state_dict_for_run(self, idx: int) -> dict[str, Any]:
        return self._scheduler(idx).state_dict()

    def load_state_dict_for_run(self, idx: int, state_dict: dict[str, Any]) -> None:
        """The checkpoint's position in the schedule (its update count), on the run's own
        `lr`, `[scheduler]` and `max_steps`: a checkpoint saved under another `lr` (a fork
        with `--set lr=...`) or a shorter `max_steps` goes on with this run's schedule."""
        scheduler = self._scheduler(idx)
        scheduler.load_state_dict(state_dict)
        config = self.manager.config[idx]
        factor = lr_factor(config.scheduler, scheduler.last_epoch, config.max_steps)
        scheduler.base_lrs = [config.lr for _ in scheduler.optimizer.param_groups]
        for group in scheduler.optimizer.param_groups:
            group["initial_lr"] = config.lr
            group["lr"] = config.lr * factor
        scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]

    def _scheduler(self, idx: int) -> LambdaLR:
        scheduler = self.schedulers[idx]
        if scheduler is None:
            raise KeyError(f"slot {idx} holds no run, so it has no scheduler")
        return scheduler
