"""Rows computed side by side on the CPU train every run exactly as rows one after another."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tests.helpers import iterate_published, make_run, random_batch
from tests.trainer.rl.test_rl_trainer import make_trainer
from workbench.files.metrics import read_metrics
from workbench.files.rollouts import write_rollouts
from workbench.trainer.lora.layer import get_lora_routing
from workbench.trainer.row_threads import RowThreads, resolve_row_threads, torch_threads

LEARNING_RATES = {"run_a": "0.01", "run_b": "0.03", "run_c": "0.002"}


def train_two_steps(experiment, tiny_llama, row_threads: int):
    runs = [make_run(experiment, name, f"lr = {lr}\n") for name, lr in LEARNING_RATES.items()]
    trainer = make_trainer(experiment, tiny_llama, row_threads=row_threads)
    rows_seen = []
    packer_pack = trainer.packer.pack

    def pack_and_count(*args, **kwargs):
        rows = packer_pack(*args, **kwargs)
        rows_seen.append(rows)
        return rows

    trainer.packer.pack = pack_and_count
    iterate_published(trainer)
    for step in range(2):
        for seed, run in enumerate(runs):
            write_rollouts(run, random_batch(run.name, step, 24, seed=seed))
        assert iterate_published(trainer) == "trained"
    return trainer, runs, rows_seen


def test_rows_side_by_side_give_every_run_the_same_bits_as_one_row_after_another(
    tmp_path, tiny_llama
):
    # One intra-op thread for both: a product split over threads may round differently.
    with torch_threads(1):
        one_by_one, runs, _ = train_two_steps(tmp_path / "one", tiny_llama, row_threads=1)
        side_by_side, _, packed = train_two_steps(tmp_path / "three", tiny_llama, row_threads=3)
    assert one_by_one.row_threads is None
    assert side_by_side.row_threads is not None and side_by_side.row_threads.threads == 3
    rows = packed[-1][0]  # this rank's rows of the last update
    assert len(rows) > 3, "enough rows for several rounds of three"
    assert any(int((row.lora_num_tokens > 0).sum()) > 1 for row in rows), "rows mixing runs"

    for run in runs:
        idx = one_by_one.manager.id_2_idx[run.name]
        assert side_by_side.manager.id_2_idx[run.name] == idx
        theirs = dict(side_by_side.manager.get_named_parameters_for_run(idx))
        for name, param in one_by_one.manager.get_named_parameters_for_run(idx):
            assert torch.equal(param, theirs[name]), f"{run.name}: {name} differs"
        ours = one_by_one.optimizer.state_dict_for_run(idx)["state"]
        other = side_by_side.optimizer.state_dict_for_run(idx)["state"]
        for key, state in ours.items():
            assert torch.equal(state["exp_avg_sq"], other[key]["exp_avg_sq"])
        expected = read_metrics(tmp_path / "one" / run.name, "trainer")
        got = read_metrics(tmp_path / "three" / run.name, "trainer")
        assert [(m["loss"], m["grad_norm"]) for m in got] == [
            (m["loss"], m["grad_norm"]) for m in expected
        ]


def test_each_thread_routes_its_own_rows_tokens(tmp_path, tiny_llama):
    make_run(tmp_path, "run_a")
    trainer = make_trainer(tmp_path, tiny_llama, row_threads=1)
    routing = get_lora_routing(trainer.model)
    both_set = threading.Barrier(2)
    seen = {}

    def route(name: str, counts: list[int]) -> None:
        routing.set_num_tokens(counts)
        both_set.wait()
        seen[name] = (routing.host_counts, routing.active_slots)

    threads = [
        threading.Thread(target=route, args=("first", [5, 0, 0])),
        threading.Thread(target=route, args=("second", [0, 2, 3])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {"first": ([5, 0, 0], [0]), "second": ([0, 2, 3], [1, 2])}


def test_a_failing_row_ends_the_update_with_its_error_and_leaves_no_row_running():
    pool = RowThreads(2)
    finished = []

    def compute(row: int) -> int:
        if row == 1:
            raise ValueError("row 1 is broken")
        time.sleep(0.05)
        finished.append(row)
        return row

    with pytest.raises(ValueError, match="row 1 is broken"):
        list(pool.map_in_order(compute, range(6)))
    done = list(finished)
    time.sleep(0.2)
    assert finished == done, "no row went on after the update failed"
    assert set(done) <= {0, 2}
    assert list(pool.map_in_order(lambda row: row * 10, range(5))) == [0, 10, 20, 30, 40]
    pool.close()


@pytest.mark.parametrize(
    ("setting", "device", "compiled", "sharded", "expected"),
    [
        ("auto", "cpu", False, False, (3, "")),
        (2, "cpu", False, False, (2, "")),
        (1, "cpu", False, False, (1, "")),
        ("auto", "cuda", False, False, (1, "")),
        (2, "cuda", False, False, (1, "rows run one after another on a GPU")),
        (2, "cpu", True, False, (1, "compiled layers run one row at a time")),
        (2, "cpu", False, True, (1, "a sharded base gathers each layer for one row at a time")),
        ("auto", "cpu", True, False, (1, "")),
    ],
)
def test_row_threads_resolve_to_one_where_rows_cannot_run_side_by_side(
    setting, device, compiled, sharded, expected
):
    with torch_threads(3):
        got = resolve_row_threads(
            setting, torch.device(device), compiled=compiled, base_sharded=sharded
        )
    assert got == expected
