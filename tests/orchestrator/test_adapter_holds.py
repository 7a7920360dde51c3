"""A run's adapter versions: a held version outlives its replacement until every holder lets
go; nothing is unloaded twice. Against the scripted stand-in for the inference server."""

from __future__ import annotations

from pathlib import Path

from tests.orchestrator.scripted import BASE_MODEL, ScriptedChat, publish_adapter
from workbench.files import layout
from workbench.inference.client import AdapterVersions


def versions_of(tmp_path: Path) -> tuple[ScriptedChat, AdapterVersions, Path]:
    run = tmp_path / "run_a"
    for step in (1, 2, 3):
        publish_adapter(run, step)
    client = ScriptedChat()
    return client, AdapterVersions(client, "run_a"), run


def test_a_version_held_twice_is_unloaded_after_the_second_release(tmp_path: Path):
    client, adapters, run = versions_of(tmp_path)
    adapters.load(1, layout.broadcast_dir(run, 1))
    first, second = adapters.hold_current(), adapters.hold_current()
    adapters.load(2, layout.broadcast_dir(run, 2))
    adapters.release(first)
    assert "run_a@step1" in client.served
    adapters.release(second)
    assert client.served == {"run_a@step2"} and client.unloaded == ["run_a@step1"]


def test_a_held_version_still_current_is_replaced_normally_once_released(tmp_path: Path):
    client, adapters, run = versions_of(tmp_path)
    adapters.load(1, layout.broadcast_dir(run, 1))
    adapters.release(adapters.hold_current())
    adapters.load(2, layout.broadcast_dir(run, 2))
    assert client.unloaded == ["run_a@step1"]


def test_stopping_unloads_held_versions_too_and_a_late_release_does_nothing(tmp_path: Path):
    client, adapters, run = versions_of(tmp_path)
    adapters.load(1, layout.broadcast_dir(run, 1))
    held = adapters.hold_current()
    adapters.load(2, layout.broadcast_dir(run, 2))
    adapters.unload_all()
    assert client.served == set()
    adapters.release(held)
    assert sorted(client.unloaded) == ["run_a@step1", "run_a@step2"]


def test_holding_the_base_model_holds_nothing(tmp_path: Path):
    client, adapters, run = versions_of(tmp_path)
    held = adapters.hold_current()
    assert (held.model, held.policy_version) == (BASE_MODEL, 0)
    adapters.load(1, layout.broadcast_dir(run, 1))
    adapters.release(held)
    assert client.unloaded == []
