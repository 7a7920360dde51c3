"""Tinker datums sharing rows (`rl/tinker_packing.py`): the check that decides it, what it
leaves behind, and how datums are laid out in packs. That a packed run's results are the
bits of its run alone is `test_tinker_work.py`'s."""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

from tests.trainer.rl.test_rl_trainer import make_trainer
from tests.trainer.rl.test_tinker_work import ADAM, drain, make_datums, submit, tinker_run
from workbench.trainer.rl import tinker_packing
from workbench.trainer.rl.tinker_packing import TinkerPack, decide_packing, pack_rows
from workbench.trainer.rl.tinker_work import TinkerRow
from workbench.trainer.rl.trainer import iterate

pytestmark = pytest.mark.slow


def every_tensor(trainer, idx: int) -> dict[str, torch.Tensor]:
    return {
        name: param.detach().clone()
        for name, param in trainer.manager.get_named_parameters_for_run(idx)
    }


def test_the_check_packs_on_this_cpu_and_leaves_the_adapters_as_they_were(
    experiment, tiny_llama, caplog
):
    caplog.set_level(logging.INFO, logger=tinker_packing.__name__)
    run = tinker_run(experiment, "run_tinker_a")
    trainer = make_trainer(experiment, tiny_llama)
    submit(run, 0, "forward_backward", make_datums(1, 4))
    assert drain(trainer, run, submit(run, 1, "optim_step", adam=ADAM)).ok
    assert trainer.tinker_packing is True
    assert "Tinker datums share rows" in caplog.text
    idx = trainer.manager.id_2_idx[run.name]
    slots = {slot: every_tensor(trainer, slot) for slot in range(trainer.manager.max_runs)}
    assert tinker_packing.packing_problem(trainer, idx) is None
    for slot, before in slots.items():  # the check makes B random in two slots meanwhile
        after = every_tensor(trainer, slot)
        assert all(torch.equal(before[name], after[name]) for name in before), slot
        assert all(p.grad is None for _, p in trainer.manager.get_named_parameters_for_run(slot))


def test_where_packs_round_otherwise_every_datum_keeps_a_row(
    experiment, tiny_llama, monkeypatch, caplog
):
    """A pack computed on two intra-op threads: how a product is split between them follows
    the row's shape, so a packed datum's bits are not its bits alone; the check sees it."""
    if torch.get_num_threads() < 2:
        pytest.skip("needs two intra-op threads")
    monkeypatch.setattr(tinker_packing, "pack_threads", lambda trainer: contextlib.nullcontext())
    run = tinker_run(experiment, "run_tinker_a")
    trainer = make_trainer(experiment, tiny_llama, row_threads=1)
    iterate(trainer)
    problem = tinker_packing.packing_problem(trainer, trainer.manager.id_2_idx[run.name])
    if problem is None:
        pytest.skip("this machine's kernels round the same on two threads whatever the shape")
    assert "than alone on this device" in problem
    submit(run, 0, "forward_backward", make_datums(1, 4))
    assert drain(trainer, run, submit(run, 1, "optim_step", adam=ADAM)).ok
    assert trainer.tinker_packing is False
    assert "Tinker datums keep a row each" in caplog.text


def test_a_sharded_base_keeps_a_row_per_datum_without_a_check(experiment, tiny_llama):
    tinker_run(experiment, "run_tinker_a")
    trainer = make_trainer(experiment, tiny_llama)
    iterate(trainer)
    trainer.base_sharded = True
    assert tinker_packing.static_problem(trainer).startswith("the base is sharded")
    assert decide_packing(trainer, 0) is False


def datum(idx: int, datum_number: int, tokens: int, grad: bool = True) -> TinkerRow:
    return TinkerRow(
        idx=idx,
        seq=0,
        datum=datum_number,
        grad=grad,
        loss_fn="cross_entropy",
        config={},
        input_ids=torch.zeros(tokens, dtype=torch.long),
        inputs={},
        max_runs=4,
    )


def layout(packs: list[TinkerPack]) -> list[list[tuple[int, int]]]:
    return [[(row.idx, row.datum) for row in pack.rows] for pack in packs]


def test_packs_are_about_even_within_the_row_length_and_forward_datums_apart():
    rows = [datum(0, i, 10) for i in range(4)] + [datum(1, i, 10) for i in range(4)]
    assert layout(pack_rows(rows, capacity=64, packs=2)) == [
        [(0, 0), (0, 1), (0, 2), (0, 3)],
        [(1, 0), (1, 1), (1, 2), (1, 3)],
    ]
    assert [p.num_tokens for p in pack_rows(rows, capacity=64, packs=1)] == [60, 20]
    assert [p.num_tokens for p in pack_rows(rows, capacity=25, packs=1)] == [20] * 4
    mixed = [datum(0, 0, 10), datum(0, 1, 10, grad=False), datum(0, 2, 10)]
    assert layout(pack_rows(mixed, capacity=64, packs=1)) == [[(0, 0), (0, 2)], [(0, 1)]]
    assert pack_rows([], capacity=64, packs=2) == []
