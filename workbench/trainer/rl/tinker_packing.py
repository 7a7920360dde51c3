"""Tinker datums packed into shared rows, each computing the bits it computes alone.

A Tinker datum as a row of its own (`tinker_work.TinkerRow`) costs a row's fixed work: on
the built-in model a 20-token row took 26 ms and a 160-token one 44 ms (2-core CPU, under
`workbench bench tinker`), so eight clients' datums cost about eight times one client's. Here the datums of a pass share rows (`TinkerPack`),
and what makes a datum's results independent of its company is kept:

- attention: every datum at its own length (`HostRow.exact_lengths`), never padded beside
  a longer one;
- the adapters: each datum is a LoRA group of its own (`route_datum_groups`), computed with
  copies of its slot's weights that are leaves of their own, so its adapter gradient is
  its tokens' alone, not summed with its neighbours' by one matmul;
- the order: the master adds those gradients to each slot in (item, datum) order, as the
  rows one after another do; a batch sent as 1 x 8 or 2 x 4 datums sums the same way.

What is left is whether a matmul's row of output depends on how many rows it is computed
with, which a BLAS does not promise. So packing is decided once, by the master at its first
pass with Tinker datums: datums of assorted lengths are computed alone and packed, and their
log-probs, losses and adapter gradients compared bit for bit (`packing_problem`; on the CPU
a pack computes on one intra-op thread, `pack_threads`); where they
differ, or where a datum's rows cannot be routed this way (a sharded base, activation
checkpointing, compiled layers), every datum keeps a row of its own, and the log says why.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import nn

from workbench.trainer.compute.model import HostRow
from workbench.trainer.lora.layer import get_lora_routing, route_datum_groups
from workbench.trainer.losses.tinker import tinker_token_losses
from workbench.trainer.rl.tinker_work import TinkerRow, TinkerRowOutput
from workbench.trainer.row_threads import torch_threads
from workbench.trainer.transfer import to_device

if TYPE_CHECKING:
    from workbench.trainer.rl.state import Trainer

logger = logging.getLogger(__name__)

# The datums of the packing check, of two slots in turn: lengths that fall in different
# attention buckets and blocks, packed together, in two packs, and each alone.
CHECK_LENGTHS = (5, 9, 12, 7, 16, 23, 31, 47)

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class TinkerPack:
    """Datums computed in one row, each its own attention sample and its own LoRA group."""

    rows: list[TinkerRow]

    @property
    def num_tokens(self) -> int:
        return sum(row.num_tokens for row in self.rows)


@dataclass
class TinkerPackOutput:
    """Each datum's output, and for each gradient datum its adapter's gradients."""

    outputs: list[TinkerRowOutput]
    # keyed by the datum's `TinkerRow.order`
    gradients: dict[tuple[int, int, int], list[tuple[nn.Parameter, torch.Tensor]]] = field(
        default_factory=dict
    )


# ---------------------------------------------------------------- deciding (master)


def static_problem(trainer: Trainer) -> str | None:
    """Why datums cannot share rows here whatever the kernels do, or None."""
    plan = trainer.row_model.plan
    if trainer.base_sharded:
        return "the base is sharded (a datum's row gathers each layer on every rank)"
    if plan.activation_checkpointing:
        return "activation checkpointing recomputes a row's layers, and their weight copies"
    if plan.compiled:
        return "compiled layers are traced for one LoRA group per run"
    return None


def decide_packing(trainer: Trainer, idx: int) -> bool:
    """Whether this trainer packs Tinker datums: once, at the first pass with some (the
    check computes with slot `idx`'s adapter and changes nothing)."""
    if trainer.tinker_packing is None:
        problem = static_problem(trainer) or packing_problem(trainer, idx)
        trainer.tinker_packing = problem is None
        if problem is None:
            logger.info(
                "Tinker datums share rows: a datum's log-probs, loss and adapter gradient "
                "are the same bits alone and packed (checked on %d datums)", len(CHECK_LENGTHS)
            )  # fmt: skip
        else:
            logger.warning("Tinker datums keep a row each (slower with many clients): %s", problem)
    return trainer.tinker_packing


def packing_problem(trainer: Trainer, idx: int) -> str | None:
    """Where a datum packed beside others computes other bits than alone, or None: the
    check datums (`forward_backward` ones, and the same as `forward` ones) alone, packed in
    one row, in two, and at the end of a full row."""
    capacity = trainer.config.trainer.seq_len
    generator = torch.Generator().manual_seed(0)
    # A second slot (whichever: its weights are only read, its B made random and restored),
    # so that the packs hold several groups of several adapters, as a pass's do.
    other = (idx + 1) % trainer.manager.max_runs
    rows = [
        _check_row(trainer, (idx, other)[number % 2], number, min(length, capacity - 1), generator)
        for number, length in enumerate(CHECK_LENGTHS)
    ]
    rows += [replace(row, grad=False, datum=row.datum + len(rows)) for row in rows]
    layouts = {
        "in one row": pack_rows(rows, capacity, 1),
        "in two rows": pack_rows(rows, capacity, 2),
    }
    for row in (rows[0], rows[len(CHECK_LENGTHS) - 1]):
        if capacity - row.num_tokens >= 2:
            filler = _check_row(trainer, idx, -1, capacity - row.num_tokens, generator)
            layouts[f"at the end of a full row ({capacity} tokens)"] = [TinkerPack([filler, row])]
    with _random_lora_b(trainer, idx, generator), _random_lora_b(trainer, other, generator):
        reference = _by_datum(compute_packs(trainer, [TinkerPack([row]) for row in rows]))
        for name, packs in layouts.items():
            for number, packed in _by_datum(compute_packs(trainer, packs)).items():
                problem = number in reference and _difference(reference[number], packed)
                if problem:
                    return (
                        f"a datum of {reference[number][0].row.num_tokens} tokens packed "
                        f"{name} gives other {problem} than alone on this device (its kernels "
                        "round by the row's shape)"
                    )
    return None


@contextlib.contextmanager
def _random_lora_b(trainer: Trainer, idx: int, generator: torch.Generator) -> Iterator[None]:
    """Slot `idx`'s B random inside the block, then exactly as it was: a new adapter's B is
    zero, and so would be every A gradient the check compares."""
    params = [
        param
        for name, param in trainer.manager.get_named_parameters_for_run(idx)
        if "lora_B" in name
    ]
    saved = [param.detach().clone() for param in params]
    try:
        with torch.no_grad():
            for param in params:
                noise = torch.randn(param.shape, generator=generator) * 0.1
                param.copy_(noise.to(param.device, param.dtype))
        yield
    finally:
        with torch.no_grad():
            for param, before in zip(params, saved, strict=True):
                param.copy_(before)


def _check_row(
    trainer: Trainer, idx: int, number: int, length: int, generator: torch.Generator
) -> TinkerRow:
    """A random `importance_sampling` datum of `length` row tokens."""
    vocab = trainer.packer.vocab_size or 2
    tokens = length - 1
    return TinkerRow(
        idx=idx,
        seq=0,
        datum=number,
        grad=True,
        loss_fn="importance_sampling",
        config={},
        input_ids=torch.randint(0, vocab, (length,), generator=generator),
        inputs={
            "advantages": torch.randn(tokens, generator=generator),
            "logprobs": -torch.rand(tokens, generator=generator) * 3,
        },
        max_runs=trainer.manager.max_runs,
    )


def _by_datum(outputs: list[TinkerPackOutput]) -> dict[int, tuple]:
    found = {}
    for pack in outputs:
        for out in pack.outputs:
            found[out.row.datum] = (out, pack.gradients.get(out.row.order, []))
    return found


def _difference(alone: tuple, packed: tuple) -> str | None:
    (a_out, a_grads), (p_out, p_grads) = alone, packed
    if not torch.equal(a_out.logprobs, p_out.logprobs):
        return "log-probs"
    if not torch.equal(a_out.loss.detach().cpu(), p_out.loss.detach().cpu()):
        return "losses"
    if len(a_grads) != len(p_grads) or not all(
        torch.equal(a.cpu(), p.cpu()) for (_, a), (_, p) in zip(a_grads, p_grads, strict=True)
    ):
        return "adapter gradients"
    return None


# ---------------------------------------------------------------- packing and computing


def pass_rows(trainer: Trainer, rows: list[TinkerRow]) -> list[TinkerRow] | list[TinkerPack]:
    """A pass's Tinker datums as the rows it computes: packs where this trainer packs,
    else a row each (rank 0, which computes them)."""
    if not rows or not decide_packing(trainer, rows[0].idx):
        return rows
    threads = trainer.row_threads.threads if trainer.row_threads is not None else 1
    return pack_rows(rows, trainer.config.trainer.seq_len, threads)


def pack_rows(rows: list[TinkerRow], capacity: int, packs: int) -> list[TinkerPack]:
    """The datums in about `packs` rows of similar size (a row thread each), each row at
    most `capacity` tokens, datums in order; `forward` datums in rows of their own,
    computed without gradient as alone (a kernel may round otherwise with autograd on)."""
    found: list[TinkerPack] = []
    for grad in (True, False):
        kind = [row for row in rows if row.grad == grad]
        total = sum(row.num_tokens for row in kind)
        target = min(capacity, max(1, -(-total // max(1, packs))))
        current: list[TinkerRow] = []
        tokens = 0
        for row in kind:
            if current and tokens + row.num_tokens > target:
                found.append(TinkerPack(current))
                current, tokens = [], 0
            current.append(row)
            tokens += row.num_tokens
        if current:
            found.append(TinkerPack(current))
    return found


def compute_packs(trainer: Trainer, packs: list[TinkerPack]) -> list[TinkerPackOutput]:
    """`pack_output` of each pack, on the row threads where the trainer has them (as a
    pass computes its rows: their intra-op threads, their rounding)."""
    return list(map_rows(trainer, lambda pack: pack_output(trainer, pack), packs))


def map_rows(
    trainer: Trainer, compute: Callable[[Item], Result], rows: Iterable[Item]
) -> Iterator[Result]:
    if trainer.row_threads is None:
        yield from map(compute, rows)
        return
    with torch_threads(1):
        yield from trainer.row_threads.map_in_order(compute, rows)


def pack_threads(trainer: Trainer) -> contextlib.AbstractContextManager:
    """One intra-op thread for a pack on the CPU, as on the row threads: with two, how a
    product is split between them follows the row's shape, and so does its rounding (a
    datum's adapter gradient differed in its last bits packed and alone, torch 2.13)."""
    if trainer.device.type == "cpu" and trainer.row_threads is None:
        return torch_threads(1)
    return contextlib.nullcontext()


def pack_output(trainer: Trainer, pack: TinkerPack) -> TinkerPackOutput:
    """The pack's forward, each datum's loss and, for the gradient datums, the gradient of
    each one's loss with respect to its own copies of its adapter (nothing is accumulated).
    On one intra-op thread on the CPU (`pack_threads`), wherever it is called from."""
    with pack_threads(trainer):
        return _pack_output(trainer, pack)


def _pack_output(trainer: Trainer, pack: TinkerPack) -> TinkerPackOutput:
    lengths = [row.num_tokens for row in pack.rows]
    starts = list(itertools.accumulate(lengths[:-1], initial=0))
    model, device = trainer.model, trainer.device
    route_datum_groups(model, lengths, [row.idx for row in pack.rows])
    positions = torch.cat([torch.arange(length) for length in lengths])
    needed = torch.ones(positions.numel(), dtype=torch.bool)
    needed[starts] = False  # a datum's first position predicts nothing of it
    host = HostRow(positions, torch.ones(positions.numel()), needed=needed, exact_lengths=True)
    input_ids = torch.cat([row.input_ids for row in pack.rows])
    result = TinkerPackOutput([])
    total = None
    with torch.set_grad_enabled(any(row.grad for row in pack.rows)):
        logprobs = trainer.row_model(to_device(input_ids, device), host)
        for row, start in zip(pack.rows, starts, strict=True):
            own = logprobs[start + 1 : start + row.num_tokens]
            inputs = {k: to_device(v, device) for k, v in row.inputs.items()}
            terms = tinker_token_losses(row.loss_fn, own, inputs, row.config)
            loss = terms.sum()
            if row.grad:
                total = loss if total is None else total + loss
            result.outputs.append(
                TinkerRowOutput(
                    row, loss.detach(), own.detach().float().cpu(), terms.detach().float().cpu()
                )
            )
    if total is None:
        return result
    leaves = get_lora_routing(model).group_leaves
    tensors = [tensor for _, leaf_a, leaf_b in leaves for tensor in (leaf_a, leaf_b)]
    grads = torch.autograd.grad(total, tensors, allow_unused=True)
    for group, row in enumerate(pack.rows):
        if not row.grad:
            continue
        gradients = result.gradients.setdefault(row.order, [])
        for (layer, _, _), grad_a, grad_b in zip(leaves, grads[0::2], grads[1::2], strict=True):
            for param, grad in ((layer.lora_A[row.idx], grad_a), (layer.lora_B[row.idx], grad_b)):
                if grad is not None:
                    gradients.append((param, grad[group]))
    return result


def accumulate_in_datum_order(outputs: list[TinkerPackOutput]) -> None:
    """Add every gradient datum's adapter gradients to its slot's, in (run, item, datum)
    order: the sums the rows one after another make, however the datums were packed."""
    by_datum = {key: grads for pack in outputs for key, grads in pack.gradients.items()}
    for key in sorted(by_datum):
        for param, grad in by_datum[key]:
            if param.grad is None:
                param.grad = grad.clone()
            else:
                param.grad.add_(grad)
