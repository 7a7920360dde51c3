"""Tinker work items: the files between the Tinker service and the trainer."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.files import tinker_work as tw


def _datum_tensors(lengths):
    tensors = {}
    for index, length in enumerate(lengths):
        tensors[tw.datum_key(index, "input_ids")] = np.arange(length, dtype=np.int64)
        tensors[tw.datum_key(index, "target_tokens")] = np.arange(1, length + 1, dtype=np.int64)
        tensors[tw.datum_key(index, "weights")] = np.ones(length, dtype=np.float32)
    return tensors


def _fb(seq, num_datums=2):
    return tw.WorkRequest(
        seq=seq, op="forward_backward", loss_fn="cross_entropy", num_datums=num_datums
    )


def test_a_request_round_trips_through_its_directory(tmp_path):
    run = tmp_path / "run_tinker_ab12"
    item = tw.write_request(run, _fb(3), _datum_tensors([4, 6]))
    assert item.path == run / "tinker" / "work" / "00000003"
    assert json.loads((item.path / "request.json").read_text())["op"] == "forward_backward"
    (pending,) = tw.pending_requests(run)
    assert pending.request == _fb(3)
    datums = pending.datums()
    assert [d["input_ids"].tolist() for d in datums] == [[0, 1, 2, 3], [0, 1, 2, 3, 4, 5]]
    assert datums[1]["weights"].dtype == np.float32
    # No staging directory is left beside it.
    assert [p.name for p in tw.work_dir(run).iterdir()] == ["00000003"]


def test_pending_requests_come_in_seq_order_and_leave_when_done(tmp_path):
    run = tmp_path / "run_t"
    for seq in (2, 0, 10):
        tw.write_request(run, _fb(seq, 1), _datum_tensors([3]))
    assert [i.seq for i in tw.pending_requests(run)] == [0, 2, 10]
    first = tw.pending_requests(run)[0]
    assert tw.read_result(run, 0) is None
    tw.write_result(
        first,
        ok=True,
        metrics={"loss:sum": 1.5},
        tensors={"d0.logprobs": np.full(3, -0.5, dtype=np.float32)},
    )
    assert [i.seq for i in tw.pending_requests(run)] == [2, 10]
    result = tw.read_result(run, 0)
    assert result.ok and result.metrics == {"loss:sum": 1.5}
    assert result.datums(1)[0]["logprobs"].tolist() == [-0.5] * 3


def test_a_failed_result_carries_its_message_and_extra_keys(tmp_path):
    run = tmp_path / "run_t"
    item = tw.write_request(
        run, tw.WorkRequest(seq=0, op="save_state", path=str(tmp_path / "s"), with_optimizer=True)
    )
    tw.write_result(item, ok=False, error="disk full")
    result = tw.read_result(run, 0)
    assert (result.ok, result.error, result.tensors) == (False, "disk full", {})
    with pytest.raises(tw.WorkItemError, match="error message"):
        tw.write_result(item, ok=False)


def test_a_seq_is_written_once(tmp_path):
    run = tmp_path / "run_t"
    tw.write_request(run, _fb(0, 1), _datum_tensors([2]))
    with pytest.raises(FileExistsError, match="00000000"):
        tw.write_request(run, _fb(0, 1), _datum_tensors([2]))


def test_optim_step_carries_adam_parameters(tmp_path):
    adam = tw.AdamParams(lr=1e-3, weight_decay=0.01, grad_clip_norm=1.0)
    item = tw.write_request(tmp_path / "run_t", tw.WorkRequest(seq=1, op="optim_step", adam=adam))
    assert tw.pending_requests(tmp_path / "run_t")[0].request.adam == adam
    assert item.tensors() == {}


@pytest.mark.parametrize(
    ("request_kwargs", "message"),
    [
        ({"op": "train"}, "op 'train'"),
        ({"op": "forward_backward", "loss_fn": "mse", "num_datums": 1}, "loss_fn 'mse'"),
        ({"op": "forward", "loss_fn": "cross_entropy"}, "at least one datum"),
        ({"op": "optim_step"}, "adam"),
        ({"op": "load_state"}, "path"),
    ],
)
def test_a_request_that_breaks_the_contract_is_refused(request_kwargs, message):
    with pytest.raises(tw.WorkItemError, match=message):
        tw.WorkRequest(seq=0, **request_kwargs)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"d0.input_ids": np.zeros(2, np.int32)}, r"d0.input_ids is int32\[2\], expected int64"),
        ({"d1.input_ids": np.zeros(2, np.int64)}, "i < 1"),
        ({"x": np.zeros(2, np.int64)}, "'x'"),
        ({"d0.images": np.zeros(2, np.int64)}, "unknown name"),
        (
            {"d0.input_ids": np.zeros(2, np.int64), "d0.target_tokens": np.zeros(3, np.int64)},
            r"lengths \[2, 3\]",
        ),
        ({"d0.input_ids": np.zeros(2, np.int64)}, "lacks target_tokens"),
    ],
)
def test_datum_tensors_that_break_the_contract_are_refused(tmp_path, tensors, message):
    with pytest.raises(tw.WorkItemError, match=message):
        tw.write_request(tmp_path / "run_t", _fb(0, 1), tensors)
    assert tw.pending_requests(tmp_path / "run_t") == []


def test_torch_tensors_are_taken_and_read_back_by_torch(tmp_path):
    torch = pytest.importorskip("torch")
    tensors = {
        "d0.input_ids": torch.tensor([5, 6], dtype=torch.int64),
        "d0.target_tokens": torch.tensor([6, 7], dtype=torch.int64),
    }
    item = tw.write_request(tmp_path / "run_t", _fb(0, 1), tensors)
    datum = item.datums()[0]
    assert torch.equal(torch.from_numpy(datum["target_tokens"]), tensors["d0.target_tokens"])


def test_the_trainers_scan_starts_at_the_first_unanswered_item_and_finds_new_ones(tmp_path):
    from workbench.trainer.rl.tinker_work import pending_items

    run = tmp_path / "run_t"
    assert pending_items(run, 0) == ([], 0)  # the service has written nothing yet
    items = [tw.write_request(run, _fb(seq, 1), _datum_tensors([3])) for seq in (1, 2, 3)]
    tw.write_result(items[0], ok=True)
    pending, start = pending_items(run, 0)
    assert [i.seq for i in pending] == [2, 3] and start == 2
    for item in items[1:]:
        tw.write_result(item, ok=True)
    assert pending_items(run, start) == ([], 4)
    tw.write_request(run, _fb(4, 1), _datum_tensors([3]))
    pending, start = pending_items(run, 4)
    assert [i.seq for i in pending] == [4] and start == 4
    # What is below the start is not looked at again: an answered item is never taken back.
    (items[0].path / tw.DONE).unlink()
    assert [i.seq for i in pending_items(run, start)[0]] == [4]
    assert [i.seq for i in pending_items(run, 0)[0]] == [1, 4]
