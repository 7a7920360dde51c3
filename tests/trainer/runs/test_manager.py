"""MultiRunManager in one process (a gloo group of one): discovery, capacity, hooks, eviction."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.helpers import make_run
from workbench.files import layout, run_control
from workbench.system.ports import free_port
from workbench.trainer.runs import manager as runs
from workbench.trainer.runs.manager import (
    MultiRunManager,
    get_multi_run_manager,
    setup_multi_run_manager,
)


@pytest.fixture(scope="module", autouse=True)
def gloo_group_of_one():
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


class HookLog:
    """Records every hook call in order, as (hook, *args)."""

    def __init__(self, manager: MultiRunManager):
        self.calls: list[tuple] = []
        manager.register_forgotten_hook(lambda idx, rid: self.calls.append(("forgotten", idx, rid)))
        manager.register_discovered_hook(
            lambda idx, rid, cfg: self.calls.append(("discovered", idx, rid))
        )
        manager.register_deletion_hook(lambda idx, rid: self.calls.append(("deletion", idx, rid)))
        manager.register_creation_hook(lambda idx, rid: self.calls.append(("creation", idx, rid)))

    def take(self) -> list[tuple]:
        calls, self.calls = self.calls, []
        return calls


def refresh(manager: MultiRunManager) -> None:
    manager.discover_runs()
    manager.synchronize_state()


def test_new_manager_has_no_runs_and_every_slot_free(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=3)
    refresh(manager)
    assert manager.idx_2_id == {} and manager.id_2_idx == {}
    assert manager.used_idxs == [] and manager.unused_idxs == [0, 1, 2]
    assert manager.ready_to_update == [False, False, False]


def test_new_run_with_valid_config_gets_a_slot_and_its_config(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=2)
    hooks = HookLog(manager)
    make_run(experiment, "run_a", "lr = 1e-3\nmax_steps = 7\n")
    refresh(manager)
    assert manager.idx_2_id == {0: "run_a"} and manager.id_2_idx == {"run_a": 0}
    assert manager.config[0].lr == 1e-3 and manager.config[0].max_steps == 7
    assert manager.progress[0].step == 0
    assert manager.get_run_dir(0) == experiment / "run_a"
    assert hooks.take() == [("discovered", 0, "run_a"), ("creation", 0, "run_a")]


def test_setup_multi_run_manager_makes_the_manager_get_multi_run_manager_finds(
    experiment: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(runs, "_manager", None)  # this process's manager, restored after
    manager = setup_multi_run_manager(output_dir=experiment, max_runs=2)
    assert get_multi_run_manager() is manager and manager.max_runs == 2
    make_run(experiment, "run_a", "")
    refresh(get_multi_run_manager())
    assert manager.idx_2_id == {0: "run_a"}
    again = setup_multi_run_manager(experiment, 3)
    assert get_multi_run_manager() is again and again is not manager


def test_get_multi_run_manager_before_setup_says_what_to_call(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(runs, "_manager", None)
    with pytest.raises(RuntimeError, match=r"setup_multi_run_manager\(output_dir, max_runs\)"):
        get_multi_run_manager()


def test_directory_without_orch_toml_is_not_a_run_until_the_handshake(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=2)
    (experiment / "run_early" / "control").mkdir(parents=True)
    refresh(manager)
    assert manager.idx_2_id == {}
    (experiment / "run_early" / "control" / "orch.toml").write_text("")
    refresh(manager)
    assert manager.idx_2_id == {0: "run_early"}


def test_entries_not_named_run_are_ignored(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=4)
    make_run(experiment, "notes")
    make_run(experiment, "checkpoints")
    (experiment / "run_file").write_text("a file, not a directory")
    (experiment / "run_").mkdir()
    make_run(experiment, "run_real")
    refresh(manager)
    assert list(manager.id_2_idx) == ["run_real"]


def test_deleted_run_frees_its_slot_and_calls_forgotten_then_deletion_hooks(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=2)
    hooks = HookLog(manager)
    make_run(experiment, "run_a")
    make_run(experiment, "run_b")
    refresh(manager)
    hooks.take()
    shutil.rmtree(experiment / "run_a")
    refresh(manager)
    assert manager.idx_2_id == {1: "run_b"}
    assert manager.unused_idxs == [0]
    assert hooks.take() == [("forgotten", 0, "run_a"), ("deletion", 0, "run_a")]


def test_full_capacity_run_waits_until_a_slot_is_deleted(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=2)
    for name in ("run_a", "run_b", "run_c"):
        make_run(experiment, name)
    refresh(manager)
    assert sorted(manager.id_2_idx) == ["run_a", "run_b"]
    assert manager.waiting_run_ids == ["run_c"]
    assert not layout.validation_error_path(experiment / "run_c").exists()

    shutil.rmtree(experiment / "run_a")
    refresh(manager)
    assert sorted(manager.id_2_idx) == ["run_b", "run_c"]
    assert manager.waiting_run_ids == []


def test_full_capacity_run_gets_the_slot_of_an_evicted_run(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=2)
    for name in ("run_a", "run_b", "run_c"):
        make_run(experiment, name)
    refresh(manager)
    manager.evict_run(manager.id_2_idx["run_b"], "diverged")
    refresh(manager)
    assert sorted(manager.id_2_idx) == ["run_a", "run_c"]


def test_waiting_runs_are_admitted_oldest_config_first(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=1)
    make_run(experiment, "run_z_first")
    refresh(manager)
    make_run(experiment, "run_b_second")
    make_run(experiment, "run_a_third")
    # Make arrival order explicit rather than trusting timestamp resolution.
    for offset, name in enumerate(["run_b_second", "run_a_third"]):
        path = layout.orch_config_path(experiment / name)
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, 10**18 + offset))
    refresh(manager)
    assert manager.waiting_run_ids == ["run_b_second", "run_a_third"]
    shutil.rmtree(experiment / "run_z_first")
    refresh(manager)
    assert list(manager.id_2_idx) == ["run_b_second"]


def test_invalid_config_writes_the_error_file_and_is_retried_once_fixed(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=2)
    run = make_run(experiment, "run_bad", "lr = 'fast'\nbogus_key = 1\n")
    refresh(manager)
    assert manager.idx_2_id == {}
    error = run_control.read_validation_error(run)
    assert error is not None
    assert "lr" in error and "bogus_key" in error and "orch.toml" in error

    layout.orch_config_path(run).write_text("lr = 0.01\n")
    refresh(manager)
    assert manager.idx_2_id == {0: "run_bad"}
    assert manager.config[0].lr == 0.01
    assert not layout.validation_error_path(run).exists()


def test_a_run_its_orchestrator_rejected_frees_its_slot_until_its_config_changes(
    experiment: Path,
):
    manager = MultiRunManager(experiment, max_runs=1)
    bad = make_run(experiment, "run_bad", 'env = "nope"\n')  # valid keys: the trainer admits it
    refresh(manager)
    assert manager.idx_2_id == {0: "run_bad"}
    # What the orchestrator writes when it cannot build the environment.
    read = run_control.current_config_signature(bad)
    run_control.write_validation_error(bad, "orch.toml: env: unknown environment 'nope'", read)
    waiting = make_run(experiment, "run_next")
    refresh(manager)
    assert manager.idx_2_id == {0: "run_next"}, "the slot went to the next run"
    assert run_control.read_validation_error(bad) is not None, "the trainer keeps it rejected"

    layout.orch_config_path(bad).write_text('env = "reverse_text"\n')
    run_control.evict(waiting, "made room", by="user")
    refresh(manager)
    assert manager.idx_2_id == {0: "run_bad"}, "an edited config is looked at again"
    assert run_control.read_validation_error(bad) is None


def test_a_run_rejected_and_edited_before_the_trainer_looks_again_is_validated_anew(
    experiment: Path,
):
    # The user fixes orch.toml while the trainer is inside a long update: the next
    # discovery sees a rejection of an older file. The run must not keep its slot on the
    # old config with the rejection standing (its orchestrator would never start again).
    manager = MultiRunManager(experiment, max_runs=1)
    hooks = HookLog(manager)
    bad = make_run(experiment, "run_bad", 'env = "nope"\n')
    refresh(manager)
    hooks.take()
    read = run_control.current_config_signature(bad)
    run_control.write_validation_error(bad, "orch.toml: env: unknown environment 'nope'", read)
    layout.orch_config_path(bad).write_text('env = "reverse_text"\n')
    refresh(manager)
    assert manager.idx_2_id == {0: "run_bad"}
    assert manager.config[0].env == "reverse_text", "the edited file, not the rejected one"
    assert run_control.read_validation_error(bad) is None
    assert run_control.run_condition(bad).kind is run_control.Condition.OPEN
    assert [call[0] for call in hooks.take()] == ["forgotten", "discovered", "deletion", "creation"]


def test_a_greedy_training_temperature_is_rejected_by_the_trainer_with_the_reason(
    experiment: Path,
):
    # Log-probs of greedy sampling would be the unscaled model's; a group of identical
    # completions has no advantage to train on, so the trainer never takes such a run.
    manager = MultiRunManager(experiment, max_runs=2)
    run = make_run(experiment, "run_greedy", "sampling = { temperature = 0.0 }\n")
    refresh(manager)
    assert manager.idx_2_id == {}
    assert "greedy decoding" in run_control.read_validation_error(run)


def test_eviction_writes_the_reason_and_the_run_leaves_at_next_discovery(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=2)
    hooks = HookLog(manager)
    run = make_run(experiment, "run_a")
    refresh(manager)
    hooks.take()
    manager.evict_run(0, "batch at step 3 had no tokens")
    assert manager.idx_2_id == {0: "run_a"}, "eviction takes effect at the next discovery"
    eviction = run_control.read_eviction(run)
    assert eviction.reason == "batch at step 3 had no tokens"
    assert eviction.evicted_by == "trainer" and eviction.evicted_at
    refresh(manager)
    assert manager.idx_2_id == {}
    assert hooks.take() == [("forgotten", 0, "run_a"), ("deletion", 0, "run_a")]


def test_raising_validation_hook_rejects_only_that_run(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=3)

    def no_big_learning_rates(config):
        if config.lr > 0.1:
            raise ValueError("learning rate above 0.1 is not supported")
        return True, ""

    manager.register_config_validation_hook(no_big_learning_rates)
    make_run(experiment, "run_ok", "lr = 0.01\n")
    bad = make_run(experiment, "run_huge", "lr = 0.5\n")
    refresh(manager)
    assert list(manager.id_2_idx) == ["run_ok"]
    first_line = run_control.read_validation_error(bad).splitlines()[0]
    assert "ValueError: learning rate above 0.1 is not supported" in first_line


def test_validation_hook_returning_false_rejects_with_its_message(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=2)
    manager.register_config_validation_hook(
        lambda config: (config.env == "reverse_text", f"unknown env {config.env!r}")
    )
    bad = make_run(experiment, "run_x", "env = 'chess'\n")
    refresh(manager)
    assert manager.idx_2_id == {}
    assert "unknown env 'chess'" in run_control.read_validation_error(bad)


def test_failing_creation_hook_rejects_the_run_without_stopping_the_trainer(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=2)

    def broken_setup(idx, run_id):
        if run_id == "run_broken":
            raise RuntimeError("optimizer state is corrupt")

    manager.register_creation_hook(broken_setup)
    make_run(experiment, "run_fine")
    broken = make_run(experiment, "run_broken")
    refresh(manager)
    refresh(manager)
    assert list(manager.id_2_idx) == ["run_fine"]
    # The first line is the one status and the TUI show: the exception's own message is on
    # it, not only in the traceback below it.
    reason = run_control.read_validation_error(broken)
    first_line, rest = reason.split("\n", 1)
    assert first_line.startswith("setting up run run_broken in the trainer failed: ")
    assert "RuntimeError: optimizer state is corrupt" in first_line
    assert "creation hook" in first_line and "broken_setup" in first_line
    assert "Traceback" in rest


def test_failing_discovered_hook_rejects_the_run_with_the_exceptions_message(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=2)

    def refuse(idx, run_id, config):
        raise KeyError("no slot state")

    manager.register_discovered_hook(refuse)
    run = make_run(experiment, "run_a")
    refresh(manager)
    first_line = run_control.read_validation_error(run).splitlines()[0]
    assert "KeyError: 'no slot state'" in first_line and "discovered hook" in first_line


def test_hooks_run_in_the_documented_order(experiment: Path):
    """Master: forgotten -> validation -> discovered; then all ranks: deletion -> creation."""
    manager = MultiRunManager(experiment, max_runs=1)
    hooks = HookLog(manager)
    manager.register_config_validation_hook(
        lambda config: hooks.calls.append(("validation", config.seed)) or (True, "")
    )
    make_run(experiment, "run_old", "seed = 1\n")
    refresh(manager)
    hooks.take()
    shutil.rmtree(experiment / "run_old")
    make_run(experiment, "run_new", "seed = 2\n")
    refresh(manager)
    assert hooks.take() == [
        ("forgotten", 0, "run_old"),
        ("validation", 2),
        ("discovered", 0, "run_new"),
        ("deletion", 0, "run_old"),
        ("creation", 0, "run_new"),
    ]


class TinyLoRA(torch.nn.Module):
    """Stands in for MultiLoRALinear here: the registration interface only."""

    def __init__(self, n_adapters: int):
        super().__init__()
        self.lora_A = torch.nn.ParameterList(
            torch.nn.Parameter(torch.ones(2, 3)) for _ in range(n_adapters)
        )

    def named_parameters_for_adapter(self, idx):
        yield "lora_A", self.lora_A[idx]

    def state_dict_for_adapter(self, idx):
        return {"lora_A.weight": self.lora_A[idx].detach().clone()}

    def reset_parameters_for_adapter(self, idx):
        with torch.no_grad():
            self.lora_A[idx].zero_()


def test_registered_lora_modules_serve_per_run_parameters_and_resets(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=2)
    layer = TinyLoRA(2)
    manager.register_lora_module("model.layers.0.q_proj", layer)
    names = [name for name, _ in manager.get_named_parameters_for_run(1)]
    assert names == ["model.layers.0.q_proj.lora_A"]
    assert manager.get_named_parameters_for_run(1)[0][1] is layer.lora_A[1]
    assert list(manager.get_state_dict_for_run(0)) == ["model.layers.0.q_proj.lora_A.weight"]
    make_run(experiment, "run_a")
    refresh(manager)  # a new run's adapter is reset on every rank
    assert torch.all(layer.lora_A[0] == 0) and torch.all(layer.lora_A[1] == 1)
    with pytest.raises(ValueError, match="already registered"):
        manager.register_lora_module("model.layers.0.q_proj", layer)
    # A module registered after the slot's parameters were listed is in the next list.
    manager.register_lora_module("model.layers.0.v_proj", TinyLoRA(2))
    names = [name for name, _ in manager.get_named_parameters_for_run(1)]
    assert names == ["model.layers.0.q_proj.lora_A", "model.layers.0.v_proj.lora_A"]
    with pytest.raises(IndexError):
        manager.get_named_parameters_for_run(2)


def test_master_publishes_slots_and_progress_for_the_cli(experiment: Path):
    manager = MultiRunManager(experiment, max_runs=2)
    make_run(experiment, "run_a")
    refresh(manager)
    manager.progress[0].step = 4
    manager.progress[0].total_tokens = 900
    manager.synchronize_state()
    state = json.loads(layout.trainer_state_path(experiment).read_text())
    assert state["slots"] == {"0": "run_a"}
    assert state["progress"]["run_a"] == {"step": 4, "total_tokens": 900, "total_samples": 0}
