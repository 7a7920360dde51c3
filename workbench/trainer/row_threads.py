"""Rows of one update computed side by side on the CPU, each on a thread of its own.

The small models a CPU trains have products too small for torch's intra-op threads to
split well. On two cores, a 4-run update of 2048-token rows of the built-in model (one
process, the forms alternating) ran 11321 tok/s on one thread, 11546 on two intra-op
threads, and 20736 with two rows at once, each on one thread. So on the CPU the trainer
gives each of its threads a row: every thread runs a row's forward and backward with
torch's intra-op threads set to one (the autograd engine runs a CPU graph's backward on
the thread that asked for it, and the LoRA routing is per thread, see `LoRARouting`).

Gradients stay bit for bit those of the rows one after another: each row's adapter
gradients come back from `torch.autograd.grad` rather than being accumulated into `.grad`
by whichever thread finishes first, and are added in row order, as the sequential
backward adds them.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Literal, TypeVar

import torch
from torch import nn

Row = TypeVar("Row")
Result = TypeVar("Result")


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run with `threads` intra-op threads (None: leave torch's setting), then restore it.

    A thread takes torch's setting at its first parallel op and keeps it: threads started
    inside this block (`RowThreads`' workers) compute on `threads` for good.
    """
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def resolve_row_threads(
    setting: int | Literal["auto"],
    device: torch.device,
    *,
    compiled: bool,
    base_sharded: bool,
) -> tuple[int, str]:
    """How many rows compute at once, and why when that is one although more were asked.

    `auto` gives every intra-op thread torch has on the CPU a row; on CUDA rows queue one
    after another on the device and threads would only contend for it. Compiled layers and
    a sharded base (whose per-layer gathers every rank must issue in the same order) run
    one row at a time.
    """
    asked = torch.get_num_threads() if setting == "auto" else setting
    if asked <= 1:
        return 1, ""
    if device.type != "cpu":
        reason = "rows run one after another on a GPU"
    elif compiled:
        reason = "compiled layers run one row at a time"
    elif base_sharded:
        reason = "a sharded base gathers each layer for one row at a time"
    else:
        return asked, ""
    return 1, reason if setting != "auto" else ""


class RowThreads:
    """A pool of `threads` workers that computes rows and hands back results in row order.

    At most `threads` rows are in flight, so at most that many rows' activations and
    gradients are held at once.
    """

    def __init__(self, threads: int) -> None:
        if threads < 2:
            raise ValueError(f"RowThreads needs at least 2 threads, got {threads}")
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="workbench-row")

    def map_in_order(
        self, compute: Callable[[Row], Result], rows: Iterable[Row]
    ) -> Iterator[Result]:
        in_flight: collections.deque[Future[Result]] = collections.deque()
        try:
            for row in rows:
                in_flight.append(self._pool.submit(compute, row))
                if len(in_flight) >= self.threads:
                    yield in_flight.popleft().result()
            while in_flight:
                yield in_flight.popleft().result()
        finally:
            # A failed row (or an abandoned generator) must not leave rows running into the
            # next update's routing and gradients.
            for future in in_flight:
                future.cancel()
            for future in in_flight:
                if not future.cancelled():
                    future.exception()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def accumulate_in_order(params: list[nn.Parameter], grads: tuple[torch.Tensor | None, ...]) -> None:
    """Add one row's gradients to `.grad` as the autograd engine would have."""
    for param, grad in zip(params, grads, strict=True):
        if grad is None:
            continue
        if param.grad is None:
            param.grad = grad
        else:
            param.grad.add_(grad)
