"""Each run's adapter published after its update, off the update's critical path.

The trainer's master copies an updated run's adapter out of its slot and checks it is
finite while it waits (the next update changes the slot's tensors in place; a non-finite
adapter evicts its run now, as before). The copy goes into host buffers kept per slot
(`AdapterPublisher.copy_out`): a fresh copy of every adapter every update had the kernel
map and zero new pages each time, which made the copy grow faster than the number of runs.
Writing the copy as `broadcast/step_N/`, and
pruning the old steps, happens on background threads while the next update computes:
with 32 Qwen3-0.6B-shaped rank-16 adapters the writes took 6.7 s an update on 8 threads
(`bench trainer --publishing`), time the update used to wait.

A run has at most one write in flight: its next publication waits for the one before, so
its steps land in order, memory holds one copy per run, and that copy's buffers are free
again by the time the slot's next update is copied into them. A write that fails (a full
disk) is collected by `reap` and its run evicted by the trainer (a run whose directory was
deleted meanwhile is forgotten by discovery instead); the orchestrator waits for that
step's adapter meanwhile, as it waited for a slow write.
Before the trainer checkpoints at a stop, or a run leaves its slot, its writes finish.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.files import layout, spans
from workbench.trainer.runs.broadcast import prune_broadcasts, write_adapter
from workbench.trainer.runs.divergence import check_finite

# Adapters written at once: their fsyncs overlap (7 a write).
PUBLISH_THREADS = 8
# Steps of a run's broadcast/ kept: an orchestrator still loading one never sees it vanish.
KEEP_BROADCASTS = 3


@dataclass(frozen=True)
class AdapterCopy:
    """One run's adapter after one update, copied out of the trainer's slot (float32, CPU)."""

    run: Path
    step: int
    tensors: dict[str, torch.Tensor]
    rank: int
    alpha: float
    target_modules: list[str]
    base_model: str

    @classmethod
    def checked(cls, run: Path, step: int, tensors: dict[str, torch.Tensor], **settings):
        """The copy of a slot's tensors (copied out already); `NonFiniteWeights` if any is not
        finite, before anything is written."""
        on_host = {key: value.detach().to("cpu", torch.float32) for key, value in tensors.items()}
        check_finite(on_host, "adapter weights")
        return cls(run, step, on_host, **settings)

    def write(self) -> None:
        """`broadcast/step_N/` of the run (whole or not at all), then the old steps pruned."""
        self.write_to(layout.broadcast_dir(self.run, self.step))
        prune_broadcasts(self.run, KEEP_BROADCASTS)

    def write_to(self, directory: Path) -> None:
        """The copy as a PEFT adapter in `directory`, whole or not at all."""
        write_adapter(
            directory,
            self.tensors,
            rank=self.rank,
            alpha=self.alpha,
            target_modules=self.target_modules,
            base_model=self.base_model,
            finite_checked=True,
        )


def _write_marked(copy: AdapterCopy) -> None:
    """`copy.write()`, kept as a span of the writing thread (`workbench trace`)."""
    with spans.span("writing adapter"):
        copy.write()


@dataclass(frozen=True)
class FailedWrite:
    idx: int
    run_id: str
    step: int
    error: BaseException


class AdapterPublisher:
    """The background writes of adapters, at most one in flight per slot (master only)."""

    def __init__(self, threads: int = PUBLISH_THREADS) -> None:
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None  # started by the first write
        self._pending: dict[int, tuple[str, AdapterCopy, Future]] = {}
        self._buffers: dict[int, dict[str, torch.Tensor]] = {}

    def copy_out(self, idx: int, views: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Slot `idx`'s adapter (`views` of its tensors) copied into the slot's host buffers,
        float32, allocated again only when the names or shapes change (another run, another
        rank). The slot's previous write must have been reaped: it reads these buffers."""
        if idx in self._pending:
            raise RuntimeError(f"slot {idx}: its previous adapter write was not reaped")
        buffers = self._buffers.get(idx)
        if buffers is None or {k: v.shape for k, v in buffers.items()} != {
            k: v.shape for k, v in views.items()
        }:
            buffers = {k: torch.empty(v.shape, dtype=torch.float32) for k, v in views.items()}
            self._buffers[idx] = buffers
        for key, view in views.items():
            buffers[key].copy_(view)
        return buffers

    def forget(self, idx: int) -> None:
        """Free the slot's buffers (its run left); its write must have been reaped."""
        self._buffers.pop(idx, None)

    def submit(self, idx: int, run_id: str, copy: AdapterCopy) -> None:
        """Write `copy` in the background. The slot's previous write must have been reaped
        (`reap(wait_for=[idx])`), so that a run's steps land in order."""
        if idx in self._pending:
            raise RuntimeError(f"slot {idx}: its previous adapter write was not reaped")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="publish")
        self._pending[idx] = (run_id, copy, self._pool.submit(_write_marked, copy))

    def reap(self, wait_for: Iterable[int] = (), *, wait_all: bool = False) -> list[FailedWrite]:
        """Forget the writes that are done, first waiting for those of `wait_for` (or all);
        the ones that failed, in slot order."""
        waited = set(self._pending) if wait_all else set(wait_for)
        failures = []
        for idx in sorted(self._pending):
            run_id, copy, future = self._pending[idx]
            if idx not in waited and not future.done():
                continue
            del self._pending[idx]
            if (error := future.exception()) is not None:
                failures.append(FailedWrite(idx, run_id, copy.step, error))
        return failures

    @property
    def in_flight(self) -> int:
        return sum(not future.done() for _, _, future in self._pending.values())
