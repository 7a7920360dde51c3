"""Adapters written in the background after an update: in order per run, failures reported."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from workbench.files import layout
from workbench.trainer.runs import publisher as publisher_module
from workbench.trainer.runs.divergence import NonFiniteWeights
from workbench.trainer.runs.publisher import AdapterCopy, AdapterPublisher

SETTINGS = {"rank": 2, "alpha": 4.0, "target_modules": ["q_proj"], "base_model": "some/base"}


def adapter(value: float) -> dict[str, torch.Tensor]:
    return {
        "model.layers.0.self_attn.q_proj.lora_A.weight": torch.full((2, 8), value),
        "model.layers.0.self_attn.q_proj.lora_B.weight": torch.full((8, 2), value),
    }


def written(run: Path, step: int) -> float | None:
    directory = layout.broadcast_dir(run, step)
    if not layout.is_stable(directory):
        return None
    tensors = load_file(str(directory / "adapter_model.safetensors"))
    return next(iter(tensors.values())).flatten()[0].item()


@pytest.fixture
def held_writes(monkeypatch):
    """Every background write waits until the test sets the returned event."""
    release = threading.Event()
    real = publisher_module.write_adapter

    def held(*args, **kwargs):
        assert release.wait(timeout=30)
        return real(*args, **kwargs)

    monkeypatch.setattr(publisher_module, "write_adapter", held)
    return release


def test_an_adapter_is_written_in_the_background_and_lands_when_reaped(tmp_path, held_writes):
    publisher = AdapterPublisher()
    publisher.submit(0, "run_a", AdapterCopy.checked(tmp_path, 1, adapter(1.0), **SETTINGS))
    assert publisher.in_flight == 1 and written(tmp_path, 1) is None
    held_writes.set()
    assert publisher.reap(wait_for=[0]) == []
    assert written(tmp_path, 1) == 1.0 and publisher.in_flight == 0


def test_a_run_has_one_write_in_flight_and_its_steps_land_in_order(tmp_path):
    publisher = AdapterPublisher()
    for step in (1, 2, 3, 4, 5):
        publisher.reap(wait_for=[0])
        publisher.submit(0, "run_a", AdapterCopy.checked(tmp_path, step, adapter(step), **SETTINGS))
    with pytest.raises(RuntimeError, match="not reaped"):
        publisher.submit(0, "run_a", AdapterCopy.checked(tmp_path, 6, adapter(6), **SETTINGS))
    assert publisher.reap(wait_all=True) == []
    # The last 3 steps are kept, each with its own weights.
    assert [step for step, _ in layout.list_step_dirs(layout.broadcasts_dir(tmp_path))] == [3, 4, 5]
    assert [written(tmp_path, step) for step in (3, 4, 5)] == [3.0, 4.0, 5.0]


def test_a_failed_write_is_reported_with_its_run_and_step_and_the_others_land(tmp_path):
    good, gone = tmp_path / "run_good", tmp_path / "run_gone"
    gone.write_text("a file where the run's directory was\n")
    publisher = AdapterPublisher()
    publisher.submit(0, "run_good", AdapterCopy.checked(good, 1, adapter(1.0), **SETTINGS))
    publisher.submit(1, "run_gone", AdapterCopy.checked(gone, 1, adapter(1.0), **SETTINGS))
    (failed,) = publisher.reap(wait_all=True)
    assert (failed.idx, failed.run_id, failed.step) == (1, "run_gone", 1)
    assert isinstance(failed.error, OSError)
    assert written(good, 1) == 1.0


def test_a_copy_that_is_not_finite_is_refused_before_anything_is_written(tmp_path):
    weights = adapter(1.0)
    next(iter(weights.values()))[0, 0] = float("nan")
    with pytest.raises(NonFiniteWeights):
        AdapterCopy.checked(tmp_path, 1, weights, **SETTINGS)
    assert not layout.broadcasts_dir(tmp_path).exists()


def test_a_slots_adapter_is_copied_into_buffers_reused_while_its_shapes_stay(tmp_path, held_writes):
    publisher = AdapterPublisher()
    slot = adapter(1.0)
    first = publisher.copy_out(0, slot)
    for tensor in slot.values():
        tensor.fill_(2.0)  # the next update changes the slot in place: the copy stays
    assert all(tensor.eq(1.0).all() for tensor in first.values())
    publisher.submit(0, "run_a", AdapterCopy.checked(tmp_path, 1, first, **SETTINGS))
    with pytest.raises(RuntimeError, match="not reaped"):
        publisher.copy_out(0, slot)  # the write in flight still reads the buffers
    held_writes.set()
    publisher.reap(wait_for=[0])
    assert written(tmp_path, 1) == 1.0

    second = publisher.copy_out(0, slot)
    assert all(second[k].data_ptr() == first[k].data_ptr() for k in first), "reused"
    assert all(tensor.eq(2.0).all() for tensor in second.values())
    wider = {
        key: torch.ones(tensor.shape[0] * 2, *tensor.shape[1:]) for key, tensor in slot.items()
    }
    assert next(iter(publisher.copy_out(0, wider).values())).shape == (4, 8)
