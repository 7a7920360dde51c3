"""Per-run optimizers and schedules: made and dropped with their runs, stepped only when ready."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from tests.trainer.builders import TinyTrainer, build_trainer, write_runs
from workbench.config import SchedulerConfig
from workbench.trainer.optim.per_run import lr_factor


def fill_grads(trainer: TinyTrainer, idx: int, value: float) -> None:
    for _, param in trainer.manager.get_named_parameters_for_run(idx):
        param.grad = torch.full_like(param, value)


def adapter(trainer: TinyTrainer, idx: int) -> dict[str, torch.Tensor]:
    return trainer.manager.get_state_dict_for_run(idx)


def test_each_run_gets_its_own_adamw_with_its_own_settings(tmp_path: Path):
    trainer = build_trainer(
        tmp_path / "exp",
        {
            "run_a": "lr = 2e-3\n[optim]\nweight_decay = 0.1\nbetas = [0.8, 0.95]\neps = 1e-6\n",
            "run_b": "lr = 5e-4\n",
        },
    )
    first, second = trainer.optimizer.optimizers
    assert first is not None and second is not None and first is not second
    group = first.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["betas"], group["eps"]) == (
        2e-3,
        0.1,
        (0.8, 0.95),
        1e-6,
    )
    assert second.param_groups[0]["lr"] == 5e-4
    own = {id(p) for _, p in trainer.manager.get_named_parameters_for_run(0)}
    assert {id(p) for p in group["params"]} == own
    assert not own & {id(p) for p in second.param_groups[0]["params"]}


def test_only_runs_ready_to_update_step_their_optimizer_and_schedule(tmp_path: Path):
    runs = {"run_a": "[scheduler]\nwarmup_steps = 4\n", "run_b": "[scheduler]\nwarmup_steps = 4\n"}
    trainer = build_trainer(tmp_path / "exp", runs)
    for idx in (0, 1):
        fill_grads(trainer, idx, 0.01)
    before = {idx: adapter(trainer, idx) for idx in (0, 1)}
    trainer.manager.ready_to_update[:] = [True, False]

    norms = trainer.optimizer.step()
    trainer.scheduler.step()

    assert set(norms) == {0}
    key = "model.layers.0.mlp.up_proj.lora_B.weight"
    assert not torch.equal(adapter(trainer, 0)[key], before[0][key])
    for name, tensor in adapter(trainer, 1).items():
        assert torch.equal(tensor, before[1][name]), name
    assert trainer.optimizer.optimizers[1].state == {}
    assert trainer.scheduler.get_last_lr(0) == pytest.approx(3e-4 * 2 / 4)
    assert trainer.scheduler.get_last_lr(1) == pytest.approx(3e-4 * 1 / 4)


def test_each_run_is_clipped_by_its_own_norm_and_max_norm(tmp_path: Path):
    trainer = build_trainer(
        tmp_path / "exp",
        {"run_a": "[optim]\nmax_norm = 1.0\n", "run_b": "[optim]\nmax_norm = 2.0\n"},
    )
    fill_grads(trainer, 0, 1e-4)  # far below its max_norm
    fill_grads(trainer, 1, 1.0)  # far above its max_norm
    n_values = sum(p.numel() for _, p in trainer.manager.get_named_parameters_for_run(0))
    trainer.manager.ready_to_update[:] = [True, True]

    norms = trainer.optimizer.clip_grad_norms([0, 1])

    assert norms[0] == pytest.approx(1e-4 * math.sqrt(n_values), rel=1e-4)
    assert norms[1] == pytest.approx(math.sqrt(n_values), rel=1e-4)
    a_grads = [p.grad for _, p in trainer.manager.get_named_parameters_for_run(0)]
    assert all(torch.allclose(g, torch.full_like(g, 1e-4)) for g in a_grads)
    b_grads = [p.grad for _, p in trainer.manager.get_named_parameters_for_run(1)]
    assert torch.linalg.vector_norm(torch.cat([g.flatten() for g in b_grads])) == pytest.approx(
        2.0, rel=1e-4
    )


def test_a_run_with_a_non_finite_gradient_skips_its_update_and_the_others_still_step(
    tmp_path: Path,
):
    trainer = build_trainer(tmp_path / "exp", {"run_a": "", "run_b": ""})
    fill_grads(trainer, 0, float("nan"))
    fill_grads(trainer, 1, 0.01)
    before = {idx: adapter(trainer, idx) for idx in (0, 1)}
    trainer.manager.ready_to_update[:] = [True, True]

    norms = trainer.optimizer.step()

    assert math.isnan(norms[0]) and math.isfinite(norms[1])
    key = "model.layers.1.self_attn.v_proj.lora_B.weight"
    assert torch.equal(adapter(trainer, 0)[key], before[0][key])
    assert not torch.equal(adapter(trainer, 1)[key], before[1][key])


def test_a_skipped_update_leaves_the_adamw_state_as_it_was_and_the_schedule_goes_on(
    tmp_path: Path,
):
    trainer = build_trainer(tmp_path / "exp", {"run_a": "[scheduler]\nwarmup_steps = 4\n"})
    trainer.manager.ready_to_update[:] = [True]
    optimizer = trainer.optimizer.optimizers[0]

    def step(value: float) -> float:
        fill_grads(trainer, 0, value)
        norm = trainer.optimizer.step()[0]
        trainer.scheduler.step()
        trainer.optimizer.zero_grad()
        return norm

    step(0.01)  # a first update: AdamW has moments and a step count
    weights = {k: v.clone() for k, v in adapter(trainer, 0).items()}
    state = {
        id(p): {k: v.clone() for k, v in entries.items()} for p, entries in optimizer.state.items()
    }
    for value in (float("nan"), float("inf")):
        assert not math.isfinite(step(value))
        # Nothing of the bad gradient reached the weights or the moments (or the step count,
        # which sets Adam's bias correction)...
        for key, tensor in adapter(trainer, 0).items():
            assert torch.equal(tensor, weights[key]), key
        for param, entries in optimizer.state.items():
            for key, tensor in entries.items():
                assert torch.equal(tensor, state[id(param)][key]), key
    # ... while the schedule counted the updates: the warm-up is at its fourth of four.
    assert trainer.scheduler.get_last_lr(0) == pytest.approx(3e-4)
    assert math.isfinite(step(0.01))
    assert all(torch.isfinite(t).all() for t in adapter(trainer, 0).values())


def test_zero_grad_clears_every_slot(tmp_path: Path):
    trainer = build_trainer(tmp_path / "exp", {"run_a": ""}, max_runs=2)
    fill_grads(trainer, 0, 1.0)
    fill_grads(trainer, 1, 1.0)  # a free slot can hold gradients from the grouped path
    trainer.optimizer.zero_grad()
    for idx in (0, 1):
        assert all(p.grad is None for _, p in trainer.manager.get_named_parameters_for_run(idx))


def test_a_deleted_then_recreated_run_gets_a_fresh_optimizer_schedule_and_adapter(tmp_path: Path):
    experiment = tmp_path / "exp"
    trainer = build_trainer(experiment, {"run_a": "seed = 3\n"})
    initial = adapter(trainer, 0)
    for _ in range(2):
        fill_grads(trainer, 0, 0.01)
        trainer.manager.ready_to_update[0] = True
        trainer.optimizer.step()
        trainer.scheduler.step()
    first_optimizer = trainer.optimizer.optimizers[0]
    assert first_optimizer.state and trainer.scheduler.schedulers[0].last_epoch == 2

    shutil.rmtree(experiment / "run_a")
    trainer.refresh()
    assert trainer.optimizer.optimizers[0] is None and trainer.scheduler.schedulers[0] is None

    write_runs(experiment, {"run_a": "seed = 3\n"})
    trainer.refresh()
    fresh = trainer.optimizer.optimizers[0]
    assert fresh is not None and fresh is not first_optimizer and fresh.state == {}
    assert trainer.scheduler.schedulers[0].last_epoch == 0
    for key, tensor in adapter(trainer, 0).items():
        torch.testing.assert_close(tensor, initial[key], rtol=0, atol=0)


def test_optimizer_and_scheduler_state_round_trips_per_run(tmp_path: Path):
    trainer = build_trainer(tmp_path / "exp", {"run_a": '[scheduler]\nkind = "linear"\n'})
    fill_grads(trainer, 0, 0.01)
    trainer.manager.ready_to_update[0] = True
    trainer.optimizer.step()
    trainer.scheduler.step()
    optimizer_state = trainer.optimizer.state_dict_for_run(0)
    scheduler_state = trainer.scheduler.state_dict_for_run(0)
    saved_lr = trainer.scheduler.get_last_lr(0)

    other = build_trainer(tmp_path / "other", {"run_a": '[scheduler]\nkind = "linear"\n'})
    other.optimizer.load_state_dict_for_run(0, optimizer_state)
    other.scheduler.load_state_dict_for_run(0, scheduler_state)

    assert other.scheduler.get_last_lr(0) == saved_lr == other.optimizer.get_lr(0)
    loaded = other.optimizer.state_dict_for_run(0)["state"]
    for param_id, state in optimizer_state["state"].items():
        torch.testing.assert_close(loaded[param_id]["exp_avg"], state["exp_avg"])
        torch.testing.assert_close(loaded[param_id]["exp_avg_sq"], state["exp_avg_sq"])


def test_on_the_cpu_each_run_steps_as_torchs_fused_adamw(tmp_path: Path):
    trainer = build_trainer(
        tmp_path / "exp", {"run_a": "lr = 2e-3\n[optim]\nweight_decay = 0.1\nmax_norm = 1e9\n"}
    )
    params = [param for _, param in trainer.manager.get_named_parameters_for_run(0)]
    reference_params = [torch.nn.Parameter(param.detach().clone()) for param in params]
    reference = torch.optim.AdamW(reference_params, lr=2e-3, weight_decay=0.1, fused=True)
    for step in range(3):
        fill_grads(trainer, 0, 0.01 * (step + 1))
        for param in reference_params:
            param.grad = torch.full_like(param, 0.01 * (step + 1))
        trainer.manager.ready_to_update[0] = True
        trainer.optimizer.step()
        reference.step()
    assert trainer.optimizer.optimizers[0].param_groups[0]["fused"] is True
    for param, expected in zip(params, reference_params, strict=True):
        assert torch.equal(param, expected)


def test_a_checkpoint_from_an_unfused_optimizer_resumes_fused(tmp_path: Path):
    trainer = build_trainer(tmp_path / "exp", {"run_a": ""})
    fill_grads(trainer, 0, 0.01)
    trainer.manager.ready_to_update[0] = True
    trainer.optimizer.step()
    saved = trainer.optimizer.state_dict_for_run(0)
    for group in saved["param_groups"]:
        group["fused"] = None  # as checkpoints written before the CPU stepped fused

    trainer.optimizer.load_state_dict_for_run(0, saved)

    assert trainer.optimizer.optimizers[0].param_groups[0]["fused"] is True
    fill_grads(trainer, 0, 0.01)
    trainer.optimizer.step()
    state = trainer.optimizer.state_dict_for_run(0)["state"]
    assert all(value["step"].item() == 2 for value in state.values())


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("constant", [0.5, 1.0, 1.0, 1.0, 1.0, 1.0]),
        ("linear", [0.5, 1.0, 1.0, 0.8, 0.6, 0.4]),
        ("cosine", [0.5, 1.0, 1.0, 0.904508, 0.654508, 0.345492]),
    ],
)
def test_schedule_warms_up_then_follows_its_kind(kind: str, expected: list[float]):
    config = SchedulerConfig(kind=kind, warmup_steps=2)
    factors = [lr_factor(config, step, max_steps=7) for step in range(6)]
    assert factors == pytest.approx(expected, abs=1e-6)


def test_schedule_decays_towards_min_lr_ratio_and_stays_there():
    config = SchedulerConfig(kind="linear", min_lr_ratio=0.1)
    assert lr_factor(config, 0, max_steps=10) == pytest.approx(1.0)
    assert lr_factor(config, 5, max_steps=10) == pytest.approx(0.55)
    assert lr_factor(config, 10, max_steps=10) == pytest.approx(0.1)
    assert lr_factor(config, 50, max_steps=10) == pytest.approx(0.1)


def test_each_run_follows_its_own_schedule(tmp_path: Path):
    trainer = build_trainer(
        tmp_path / "exp",
        {
            "run_a": 'lr = 1e-3\nmax_steps = 4\n[scheduler]\nkind = "linear"\n',
            "run_b": 'lr = 1e-2\nmax_steps = 4\n[scheduler]\nkind = "cosine"\nwarmup_steps = 1\n',
        },
    )
    lrs = []
    for _ in range(3):
        lrs.append((trainer.optimizer.get_lr(0), trainer.optimizer.get_lr(1)))
        trainer.manager.ready_to_update[:] = [True, True]
        for idx in (0, 1):
            fill_grads(trainer, idx, 0.01)
        trainer.optimizer.step()
        trainer.scheduler.step()
    a = [lr for lr, _ in lrs]
    b = [lr for _, lr in lrs]
    assert a == pytest.approx([1e-3, 0.75e-3, 0.5e-3])
    assert b == pytest.approx([1e-2, 1e-2, 1e-2 * 0.5 * (1 + math.cos(math.pi / 3))])
