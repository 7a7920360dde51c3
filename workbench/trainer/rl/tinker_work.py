"""The trainer's side of Tinker work items (`workbench.files.tinker_work`, docs/contracts.md).

A run whose orch.toml says `source = "tinker"` is driven by its client's work items, taken
strictly in seq order. Each pass of the trainer's loop (`trainer.iterate`) the master looks
at every Tinker run's pending items and takes, per run, its leading `forward_backward` /
`forward` items (at most `MAX_DATUM_ITEMS`), then at most one other op, which applies after
the pass's backward; the rest waits for the next pass. The taken items form a `TinkerPass`,
broadcast to every rank with the native runs' rows.

Each datum is a `TinkerRow`, computed and backwarded in the same pass as the native runs'
packed rows (side by side with them on the CPU's row threads): in rows it shares with the
pass's other datums where the trainer's check found that packing changes no bit of a
datum's results (`tinker_packing.py`), else in a row of its own. Either way a Tinker run's
results do not depend on the company it keeps, and 8 datums as 1 x 8 or 2 x 4 give the
same gradient sum: each datum's adapter gradient is its own, added to the run's slot in
datum order, and stays there, across passes (the trainer's zero_grad keeps Tinker slots),
until an `optim_step` item steps and zeroes them. Rows go to rank 0, whose master writes the results; with several ranks the run's
gradients are summed over ranks at its optim_step (the others contribute zeros).

Positions: a datum of length T has `input_ids` x and `target_tokens` y with y[t] the token
position t predicts. The trainer's rows give log p(token t | tokens before t), so the row
is x followed by y[T-1], and y[:-1] must equal x[1:] (next-token targets: what the SDK's
`datum_from_tokens` and the cookbook send); a datum otherwise is refused with that reason.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from workbench.files import tinker_work as tw
from workbench.files.metrics import append_metrics
from workbench.trainer.compute.model import HostRow
from workbench.trainer.lora.layer import set_lora_num_tokens
from workbench.trainer.losses.tinker import tinker_loss_problem, tinker_token_losses
from workbench.trainer.rl.state import Trainer
from workbench.trainer.transfer import to_device

if TYPE_CHECKING:
    from workbench.trainer.runs.manager import MultiRunManager

logger = logging.getLogger(__name__)

# Datum items of one run taken in one pass: a client that queued many waits a pass or more,
# so a pass stays bounded and other runs' work is not held up behind it.
MAX_DATUM_ITEMS = 4
# How often an idle trainer with Tinker runs looks for a new work item: one stat of each
# run's work directory (an item lands there by a rename, which changes its mtime). A client's
# request then waits about 5 ms for its pass instead of half the idle poll
# (`[trainer] poll_interval_s`, 0.2 s): the round trip `workbench bench tinker` measures.
TINKER_WAKE_S = 0.01
_FLOAT_INPUTS = ("weights", "advantages", "logprobs", "clip_low_threshold", "clip_high_threshold")


@dataclass
class TinkerRow:
    """One datum of a `forward_backward` (grad) or `forward` item, as a row of its own."""

    idx: int
    seq: int
    datum: int
    grad: bool
    loss_fn: str
    config: dict[str, float]
    input_ids: torch.Tensor  # int64 [T + 1]: the datum's input_ids, then its last target
    inputs: dict[str, torch.Tensor]  # float32 [T] each: weights, advantages, logprobs, ...
    max_runs: int

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def order(self) -> tuple[int, int, int]:
        """Where its gradient goes among the pass's: by slot, then item, then datum."""
        return self.idx, self.seq, self.datum


@dataclass
class TinkerRowOutput:
    """What a row gives back: the datum's loss (what to backward) and, detached, its
    target tokens' log-probs and loss terms."""

    row: TinkerRow
    loss: torch.Tensor
    logprobs: torch.Tensor
    elementwise_loss: torch.Tensor


@dataclass
class PlannedItem:
    idx: int
    run_id: str
    item: tw.WorkItem
    error: str | None = None  # refused before the pass: answered with this


@dataclass
class TinkerPass:
    """The Tinker work of one pass, in the order it applies."""

    items: list[PlannedItem] = field(default_factory=list)
    rows: list[TinkerRow] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.items)

    def early(self) -> list[PlannedItem]:
        """The ops of runs with no datum in this pass (a client's save for its sampler, an
        optim_step after an earlier pass's forward_backward): nothing the pass computes
        touches their runs, so they apply before it rather than after, and their clients
        wait for no other client's datums."""
        return [p for p in self.items if self._applies_early(p)]

    def late(self) -> list[PlannedItem]:
        """Every other item: datum items, and the op that follows a run's datums."""
        return [p for p in self.items if not self._applies_early(p)]

    def _applies_early(self, planned: PlannedItem) -> bool:
        return planned.item.request.op not in tw.DATUM_OPS and not any(
            p.idx == planned.idx and p.item.request.op in tw.DATUM_OPS for p in self.items
        )


def is_tinker_run(manager: MultiRunManager, idx: int) -> bool:
    config = manager.config.get(idx)
    return config is not None and config.source == tw.SOURCE_TINKER


def tinker_slots(manager: MultiRunManager) -> list[int]:
    return [idx for idx in manager.used_idxs if is_tinker_run(manager, idx)]


# ---------------------------------------------------------------- taking the work (master)


def wait_for_tinker_work(trainer: Trainer, timeout_s: float) -> None:
    """Sleep `timeout_s`, or less if a Tinker run's work directory changes meanwhile. Every
    rank waits the same way, on the same directories, so they wake together."""
    manager = trainer.manager
    dirs = [tw.work_dir(manager.get_run_dir(idx)) for idx in tinker_slots(manager)]
    if not dirs:
        time.sleep(timeout_s)
        return
    seen = [_mtime_ns(directory) for directory in dirs]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(TINKER_WAKE_S)
        if [_mtime_ns(directory) for directory in dirs] != seen:
            return


def _mtime_ns(directory: Path) -> int:
    try:
        return directory.stat().st_mtime_ns
    except OSError:  # not made yet: the service makes it with the first item
        return 0


def collect_tinker_work(trainer: Trainer) -> TinkerPass:
    """Master: the items every Tinker run has ready for this pass, and their rows."""
    manager = trainer.manager
    work = TinkerPass()
    slots = tinker_slots(manager)
    # A run that left its slot is forgotten: one of its id that comes later starts afresh.
    present = {manager.idx_2_id[idx] for idx in slots}
    for gone in set(trainer.tinker_answered) - present:
        del trainer.tinker_answered[gone]
    for idx in slots:
        run, run_id = manager.get_run_dir(idx), manager.idx_2_id[idx]
        try:
            pending, trainer.tinker_answered[run_id] = pending_items(
                run, trainer.tinker_answered.get(run_id, 0)
            )
        except (
            OSError,
            ValueError,
            TypeError,
        ) as err:  # request.json broken: the service's contract
            manager.evict_run(idx, f"an unreadable Tinker work item: {err}")
            continue
        # Every item before the last taken is a datum item: `taken` counts them.
        for taken, item in enumerate(pending, start=1):
            planned = PlannedItem(idx, run_id, item)
            work.items.append(planned)
            if item.request.op not in tw.DATUM_OPS:
                break  # applies after the pass's backward; what follows waits for it
            try:
                work.rows += datum_rows(trainer, idx, item)
            except ValueError as err:
                planned.error = str(err)
            if taken >= MAX_DATUM_ITEMS:
                break
    return work


def pending_items(run: Path, first: int = 0) -> tuple[list[tw.WorkItem], int]:
    """The items of `run` from seq `first` on that have no answer yet, in seq order, and
    the seq the next scan can start from: every item below it is answered.

    The service writes a run's items in seq order and an answer is never taken back, so
    the items below the first unanswered one need no second look. Before, every poll
    looked at every item's DONE: a session's thousands of items cost the trainer more than
    its compute (2 s in 10 of a bench run's main line with 90 items a run, py-spy)."""
    root = tw.work_dir(run)
    try:
        names = os.listdir(root)
    except FileNotFoundError:  # not made yet: the service makes it with the first item
        return [], first
    seqs = sorted(int(name) for name in names if len(name) == 8 and name.isdigit())
    seqs = [seq for seq in seqs if seq >= first]
    items = []
    for seq in seqs:
        entry = tw.item_dir(run, seq)
        if not (entry / tw.DONE).exists():
            request = tw.WorkRequest.from_json((entry / tw.REQUEST_JSON).read_text())
            items.append(tw.WorkItem(entry, request))
    if items:
        return items, items[0].request.seq
    return items, seqs[-1] + 1 if seqs else first


def datum_rows(trainer: Trainer, idx: int, item: tw.WorkItem) -> list[TinkerRow]:
    """The item's datums as rows; ValueError naming the datum and what is wrong."""
    request = item.request
    config = dict(request.loss_fn_config or {})
    rows = []
    for number, datum in enumerate(item.datums()):
        problem = tinker_loss_problem(request.loss_fn, set(datum), config) or _datum_problem(
            datum, trainer.packer.vocab_size, trainer.config.trainer.seq_len
        )
        if problem:
            raise ValueError(f"work item {request.seq}, datum {number}: {problem}")
        input_ids = torch.from_numpy(
            np.concatenate([datum["input_ids"], datum["target_tokens"][-1:]])
        )
        rows.append(
            TinkerRow(
                idx=idx,
                seq=request.seq,
                datum=number,
                grad=request.op == "forward_backward",
                loss_fn=request.loss_fn,
                config=config,
                input_ids=input_ids,
                inputs={k: torch.from_numpy(datum[k].copy()) for k in _FLOAT_INPUTS if k in datum},
                max_runs=trainer.manager.max_runs,
            )
        )
    return rows


def _datum_problem(
    datum: dict[str, np.ndarray], vocab_size: int | None, seq_len: int
) -> str | None:
    input_ids, targets = datum["input_ids"], datum["target_tokens"]
    if input_ids.size == 0:
        return "no tokens"
    if input_ids.size + 1 > seq_len:
        return f"{input_ids.size} tokens: the trainer's rows hold {seq_len - 1} ([trainer] seq_len)"
    for name, ids in (("input_ids", input_ids), ("target_tokens", targets)):
        if ids.min() < 0 or (vocab_size is not None and ids.max() >= vocab_size):
            return f"{name} holds a token id outside the vocabulary [0, {vocab_size})"
    if not np.array_equal(targets[:-1], input_ids[1:]):
        return "target_tokens must be input_ids shifted by one (next-token targets)"
    for name in _FLOAT_INPUTS:
        if name in datum and not np.isfinite(datum[name]).all():
            return f"{name} is not finite"
    return None


# ---------------------------------------------------------------- computing a row


def tinker_row_output(trainer: Trainer, row: TinkerRow) -> TinkerRowOutput:
    """The row's forward (with the gradient for a forward_backward datum) and its loss."""
    counts = torch.zeros(row.max_runs, dtype=torch.int64)
    counts[row.idx] = row.num_tokens
    set_lora_num_tokens(trainer.model, counts)
    needed = torch.ones(row.num_tokens, dtype=torch.bool)
    needed[0] = False  # position 0 predicts nothing of the datum's
    host = HostRow(torch.arange(row.num_tokens), torch.ones(row.num_tokens), needed=needed)
    # With the base sharded every rank's rows gather each layer in the backward too (the
    # other ranks' filler rows do): a `forward` datum's row goes through a backward whose
    # gradients are dropped, or the ranks' collectives would no longer pair up.
    backward_only_to_gather = trainer.base_sharded and not row.grad
    with torch.set_grad_enabled(row.grad or backward_only_to_gather):
        logprobs = trainer.row_model(to_device(row.input_ids, trainer.device), host)[1:]
        inputs = {k: to_device(v, trainer.device) for k, v in row.inputs.items()}
        terms = tinker_token_losses(row.loss_fn, logprobs, inputs, row.config)
        loss = terms.sum()
    if backward_only_to_gather:
        params = [param for _, param in trainer.manager.get_named_parameters_for_run(row.idx)]
        torch.autograd.grad(loss * 0, params, allow_unused=True)
        loss = loss.detach()
    return TinkerRowOutput(row, loss, logprobs.detach().float().cpu(), terms.detach().float().cpu())


def row_parameters(trainer: Trainer, row: TinkerRow) -> list[torch.nn.Parameter]:
    """The parameters a row's backward reaches: its run's adapter; none for a forward."""
    if not row.grad:
        return []
    return [param for _, param in trainer.manager.get_named_parameters_for_run(row.idx)]


# ---------------------------------------------------------------- after the pass


def start_tinker_pass(trainer: Trainer, work: TinkerPass) -> None:
    """Every rank, before the pass computes: apply and answer its early ops (`TinkerPass.early`)."""
    _apply_items(trainer, work.early(), {})


def finish_tinker_pass(trainer: Trainer, work: TinkerPass, outputs: list[TinkerRowOutput]) -> None:
    """Every rank, after the pass's backward: apply the other items in order; the master
    answers each. An op that fails answers its item with the error; the trainer goes on."""
    by_item: dict[tuple[int, int], list[TinkerRowOutput]] = {}
    for out in outputs:
        by_item.setdefault((out.row.idx, out.row.seq), []).append(out)
    _apply_items(trainer, work.late(), by_item)


def _apply_items(
    trainer: Trainer,
    items: list[PlannedItem],
    by_item: dict[tuple[int, int], list[TinkerRowOutput]],
) -> None:
    answers: list[ItemAnswer] = []
    for planned in items:
        if not trainer.manager.get_run_dir(planned.idx).is_dir():
            continue  # deleted meanwhile: the next discovery forgets it
        try:
            if planned.error is not None:
                raise ValueError(planned.error)
            outputs = by_item.get((planned.idx, planned.item.seq), [])
            answer, files = apply_item(trainer, planned, outputs)
        except (ValueError, OSError, RuntimeError, KeyError) as err:
            logger.warning("%s: work item %d failed: %s", planned.run_id, planned.item.seq, err)
            answers.append(ItemAnswer(planned, error=f"{type(err).__name__}: {err}"))
            continue
        answers.append(ItemAnswer(planned, answer, files))
    if trainer.manager.is_master:
        _write_answers(trainer, answers)


@dataclass
class ItemAnswer:
    """An applied item's answer: write_result's keyword arguments, or its error; `files`,
    what must be on disk before it is answered (a sampler save's adapters)."""

    planned: PlannedItem
    answer: dict = field(default_factory=dict)
    files: Callable[[], None] | None = None
    error: str | None = None

    def write(self) -> None:
        if self.error is None and self.files is not None:
            try:
                self.files()
            except OSError as err:
                logger.warning("%s: work item %d failed: %s", self.planned.run_id,
                               self.planned.item.seq, err)  # fmt: skip
                self.error = f"{type(err).__name__}: {err}"
        if self.error is None:
            tw.write_result(self.planned.item, True, **self.answer)
        else:
            tw.write_result(self.planned.item, False, error=self.error)


def _write_answers(trainer: Trainer, answers: list[ItemAnswer]) -> None:
    """Master: every answer of the ops just applied, and the files they name; a run's in
    seq order, the runs side by side. Each file is fsynced (a few ms here); one after
    another, eight clients' sampler saves and answers held a pass's start by more than its
    compute. Written in threads, the filesystem commits them together. All are written
    before the trainer goes on."""
    by_run: dict[int, list[ItemAnswer]] = {}
    for answer in answers:
        by_run.setdefault(answer.planned.idx, []).append(answer)
    if len(by_run) <= 1:
        _write_in_order(answers)
        return
    writes = [trainer.answer_writers.submit(_write_in_order, run) for run in by_run.values()]
    for done in writes:
        done.result()  # a write that fails (a full disk) fails the trainer, as inline


def _write_in_order(answers: list[ItemAnswer]) -> None:
    for answer in answers:
        answer.write()


def apply_item(
    trainer: Trainer, planned: PlannedItem, outputs: list[TinkerRowOutput]
) -> tuple[dict, Callable[[], None] | None]:
    """One item's effect; returns write_result's keyword arguments (metrics, tensors, ...)
    and what to write before the answer (a sampler save's adapters), if anything."""
    request = planned.item.request
    if request.op in tw.DATUM_OPS:
        return datum_answer(trainer, planned, outputs), None
    if request.op == "optim_step":
        return optim_step(trainer, planned.idx, request.adam), None
    from workbench.trainer.rl import tinker_state

    if request.op == "save_state":
        tinker_state.save_state(trainer, planned.idx, Path(request.path), request.with_optimizer)
        return {"path": request.path}, None
    if request.op == "load_state":
        tinker_state.load_state(trainer, planned.idx, Path(request.path), request.with_optimizer)
        return {"path": request.path, "step": trainer.manager.progress[planned.idx].step}, None
    return tinker_state.save_for_sampler(trainer, planned.idx, Path(request.path))


def datum_answer(trainer: Trainer, planned: PlannedItem, outputs: list[TinkerRowOutput]) -> dict:
    """A forward_backward / forward item's result: each datum's log-probs and loss terms,
    the loss summed over datums and tokens (`loss:sum`, Tinker's name)."""
    outputs = sorted(outputs, key=lambda out: out.row.datum)
    if len(outputs) != planned.item.request.num_datums:
        raise RuntimeError(f"{len(outputs)} of {planned.item.request.num_datums} datums computed")
    tensors, loss, tokens = {}, 0.0, 0
    for out in outputs:
        tensors[tw.datum_key(out.row.datum, "logprobs")] = out.logprobs.numpy()
        tensors[tw.datum_key(out.row.datum, "elementwise_loss")] = out.elementwise_loss.numpy()
        loss += float(out.loss.detach())
        tokens += out.logprobs.numel()
    if planned.item.request.op == "forward_backward":
        progress = trainer.manager.progress[planned.idx]
        progress.total_tokens += tokens
        progress.total_samples += len(outputs)
        tally = trainer.tinker_tally
        tally.loss[planned.idx] = tally.loss.get(planned.idx, 0.0) + loss
        tally.tokens[planned.idx] = tally.tokens.get(planned.idx, 0) + tokens
    return {
        "metrics": {"loss:sum": loss},
        "tensors": tensors,
        "num_datums": len(outputs),
    }


def optim_step(trainer: Trainer, idx: int, adam: tw.AdamParams) -> dict:
    """The run's AdamW step with the item's parameters (every rank): its gradients summed
    over ranks, clipped to `grad_clip_norm` (0: not clipped), stepped, then dropped."""
    from workbench.trainer.optim.multi_adamw import clip_grad_norms_together
    from workbench.trainer.parallel import distributed

    manager = trainer.manager
    params = [param for _, param in manager.get_named_parameters_for_run(idx)]
    distributed.all_reduce_grads(params, trainer.device)
    max_norm = adam.grad_clip_norm if adam.grad_clip_norm > 0 else math.inf
    norm = clip_grad_norms_together({idx: params}, {idx: max_norm})[idx]
    optimizer = trainer.optimizer.optimizers[idx]
    for group in optimizer.param_groups:
        group.update(
            lr=adam.lr,
            betas=(adam.beta1, adam.beta2),
            eps=adam.eps,
            weight_decay=adam.weight_decay,
        )
    finite = math.isfinite(norm)
    if finite:
        optimizer.step()
    for param in params:
        param.grad = None
    if not finite:
        raise ValueError(f"the gradient norm is {norm}: update skipped, gradients dropped")
    progress = manager.progress[idx]
    progress.step += 1
    if manager.is_master:
        _log_tinker_step(trainer, idx, norm, adam.lr)
    return {
        "metrics": {"grad_norm:mean": norm, "learning_rate:mean": adam.lr},
        "step": progress.step,
    }


def _log_tinker_step(trainer: Trainer, idx: int, norm: float, lr: float) -> None:
    """The run's trainer metrics line, as a native run's update writes one."""
    manager, tally = trainer.manager, trainer.tinker_tally
    progress = manager.progress[idx]
    loss = tally.loss.get(idx, 0.0)
    append_metrics(
        manager.get_run_dir(idx),
        "trainer",
        progress.step,
        loss=loss,
        grad_norm=norm,
        lr=lr,
        loss_kind="tinker",
        tokens=progress.total_tokens,
        samples=progress.total_samples,
    )
    logger.info(
        "%s step %d loss:sum %.4f grad_norm %.3f lr %.2e tokens %d (tinker)",
        manager.idx_2_id[idx], progress.step, loss, norm, lr, progress.total_tokens,
    )  # fmt: skip
    tally.forget(idx)


def forget_tinker_slot(trainer: Trainer, idx: int) -> None:
    """A run left slot `idx` (deletion hook, every rank): its pending gradients and tally go."""
    for _, param in trainer.manager.get_named_parameters_for_run(idx):
        param.grad = None
    trainer.tinker_tally.forget(idx)
