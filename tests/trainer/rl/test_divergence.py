"""A run whose training diverges is evicted as `diverged`, and its non-finite weights are
never written; the runs beside it train bit for bit as they would without it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import iterate_published, make_run, random_batch
from tests.trainer.rl.test_rl_trainer import make_trainer
from workbench.files import layout, run_control
from workbench.files.metrics import read_metrics
from workbench.files.rollouts import write_rollouts
from workbench.trainer.optim import per_run as optim
from workbench.trainer.rl.trainer import Trainer
from workbench.trainer.runs.checkpoint import ADAPTER_FILE, PART
from workbench.trainer.runs.divergence import NON_FINITE_UPDATES, STALLED, non_finite_names

GOOD = "lr = 0.01\nmax_steps = 8\n"
STEPS = 6


def poison_gradients(trainer: Trainer, run_id: str) -> list:
    """Make the run's next gradient non-finite (inf, and nan where it was 0), as a
    diverged adapter's are; returns the hooks to remove."""
    idx = trainer.manager.id_2_idx[run_id]
    params = [param for _, param in trainer.manager.get_named_parameters_for_run(idx)]
    return [param.register_hook(lambda grad: grad * math.inf) for param in params]


def train(
    experiment: Path,
    model: Path,
    runs: dict[str, str],
    poisoned: dict[str, range] | None = None,
    until: dict[str, int] | None = None,
) -> Trainer:
    """`STEPS` steps of every run that is still in the trainer, one batch each per step
    (until its update `until[run_id]`); `poisoned[run_id]`: the updates whose gradient
    `poison_gradients` makes non-finite."""
    dirs = {run_id: make_run(experiment, run_id, orch) for run_id, orch in runs.items()}
    trainer = make_trainer(experiment, model)
    iterate_published(trainer)
    for step in range(STEPS):
        hooks = []
        for run_id, run in dirs.items():
            if run_control.read_eviction(run) is not None or step >= (until or {}).get(
                run_id, STEPS
            ):
                continue  # its orchestrator has stopped
            write_rollouts(run, random_batch(run_id, step, 6, seed=1))
            if step + 1 in (poisoned or {}).get(run_id, ()):
                hooks += poison_gradients(trainer, run_id)
        assert iterate_published(trainer) == "trained"
        for hook in hooks:
            hook.remove()
    iterate_published(trainer)  # the discovery that lets an evicted run go
    return trainer


def adapters(run: Path) -> dict[int, dict[str, torch.Tensor]]:
    return {
        step: load_file(str(path / "adapter_model.safetensors"))
        for step, path in layout.list_step_dirs(layout.broadcasts_dir(run))
        if layout.is_stable(path)
    }


def trainer_lines(run: Path) -> list[tuple[int, float, float]]:
    return [(r["step"], r["loss"], r["grad_norm"]) for r in read_metrics(run, "trainer")]


def assert_trains_the_same(run: Path, reference: Path, *, exact: bool = True) -> None:
    """Every update of `run`: its loss, gradient norm and adapters as `reference`'s, bit for
    bit (`exact`) or within the rounding of other packed rows (`exact=False`)."""
    assert run_control.read_eviction(run) is None
    lines, expected = trainer_lines(run), trainer_lines(reference)
    assert len(lines) == STEPS
    if exact:
        assert lines == expected
    else:
        flat = [number for line in lines for number in line]
        assert flat == pytest.approx([number for line in expected for number in line], rel=1e-5)
    ours, theirs = adapters(run), adapters(reference)
    assert sorted(ours) == sorted(theirs) == [4, 5, 6]
    for step, tensors in theirs.items():
        for key, tensor in tensors.items():
            if exact:
                assert torch.equal(ours[step][key], tensor), (step, key)
            else:
                torch.testing.assert_close(ours[step][key], tensor, rtol=1e-5, atol=1e-7)


def test_a_diverging_run_is_evicted_and_the_run_beside_it_trains_as_if_it_had_not(
    tmp_path, tiny_llama
):
    runs = {"run_good": GOOD, "run_bad": GOOD}
    beside = tmp_path / "beside"
    # From update 3 on, run_bad's gradient is not finite, as a diverged adapter's stays.
    trainer = train(beside, tiny_llama, runs, poisoned={"run_bad": range(3, STEPS + 1)})
    # The same two runs and batches, run_bad healthy (and done after update 5, as its
    # diverged twin is); and run_good alone.
    healthy = tmp_path / "healthy"
    train(healthy, tiny_llama, runs, until={"run_bad": 5})
    alone = tmp_path / "alone"
    train(alone, tiny_llama, {"run_good": GOOD})

    # Evicted at its K-th non-finite update in a row (3, 4, 5), with a reason that says so.
    bad = beside / "run_bad"
    assert NON_FINITE_UPDATES == 3
    assert [step for step, _, _ in trainer_lines(bad)] == [1, 2, 3, 4, 5], "then it stops"
    assert [math.isfinite(norm) for _, _, norm in trainer_lines(bad)][2:] == [False] * 3
    condition = run_control.run_condition(bad)
    assert condition.diverged and condition.status == "diverged"
    assert condition.evicted_by == "trainer"
    # inf, or nan where a gradient had zeros: the poison gives either, as divergence does
    assert re.match(r"diverged: gradient norm (inf|nan|inf/nan) at updates 3-5; ", condition.reason)
    assert "run_bad" not in trainer.manager.id_2_idx, "its slot is free"
    # Its skipped updates left the adapter as after update 2, finite, published as it was;
    # the update that evicted it published nothing; it left with that adapter checkpointed.
    published = adapters(bad)
    assert sorted(published) == [2, 3, 4]
    for step in (3, 4):
        for key, tensor in published[step].items():
            assert torch.equal(tensor, published[2][key]), (step, key)
    checkpoint = load_file(str(layout.checkpoint_part_dir(bad, 5, PART) / ADAPTER_FILE))
    assert all(torch.isfinite(tensor).all() for tensor in checkpoint.values())

    # run_good: bit for bit what it does beside the healthy twin; as alone but for the
    # rounding that other runs' samples in its rows bring (tests/trainer/test_isolation.py).
    assert_trains_the_same(beside / "run_good", healthy / "run_good")
    assert_trains_the_same(beside / "run_good", alone / "run_good", exact=False)


@pytest.mark.parametrize(
    ("lr", "reason", "evicted_at"),
    [
        # The run: update 2 throws the adapter so far that from update 3 its gradient
        # norm is nan on some CPUs and, on others, exactly 0 (a saturated softmax).
        ("1000.0", rf"gradient norm (nan|{re.escape(STALLED)}) at updates 3-5", 5),
        # Update 1 throws it so far that from update 2 its activations overflow float32, on
        # any CPU, in rows it shares with run_good (a padded sample's gradient goes back to
        # that sample only: attention.py).
        ("1e30", "loss nan, gradient norm nan at updates 2-4", 4),
    ],
)
def test_a_learning_rate_far_too_high_diverges_and_is_evicted(
    tmp_path, tiny_llama, lr, reason, evicted_at
):
    beside = tmp_path / "beside"
    train(beside, tiny_llama, {"run_good": GOOD, "run_x": f"lr = {lr}\nmax_steps = 8\n"})
    healthy = tmp_path / "healthy"
    train(healthy, tiny_llama, {"run_good": GOOD, "run_x": GOOD}, until={"run_x": evicted_at})

    got = run_control.read_eviction(beside / "run_x").reason
    assert re.match(rf"diverged: {reason}; ", got), got
    # Its nan and huge activations share rows with run_good's and change nothing there.
    assert_trains_the_same(beside / "run_good", healthy / "run_good")


def write_steps(trainer, runs: dict[str, Path], steps: int, change=None) -> None:
    """`steps` updates of every run, one random batch each; `change(run_id, batch)` may
    alter a batch before it is written."""
    for step in range(steps):
        for run_id, run in runs.items():
            batch = random_batch(run_id, step, 6, seed=1)
            if change is not None:
                change(run_id, batch)
            write_rollouts(run, batch)
        assert iterate_published(trainer) == "trained"


def test_a_run_whose_gradient_is_0_with_advantages_three_updates_in_a_row_is_evicted(
    tmp_path, tiny_llama
):
    # Its sampler's log-probs are e^100 away from the trainer's: every token's importance
    # ratio is masked, the gradient is exactly 0 and the adapter never moves.
    runs = {name: make_run(tmp_path, name, GOOD) for name in ("run_good", "run_far")}
    trainer = make_trainer(tmp_path, tiny_llama)
    iterate_published(trainer)

    def far_from_the_sampler(run_id, batch):
        if run_id == "run_far":
            for sample in batch.samples:
                sample.completion_logprobs = [-100.0] * len(sample.completion_ids)

    write_steps(trainer, runs, NON_FINITE_UPDATES, far_from_the_sampler)
    reason = run_control.read_eviction(runs["run_far"]).reason
    assert reason.startswith(f"diverged: gradient norm {STALLED} at updates 1-3; "), reason
    lines = read_metrics(runs["run_far"], "trainer")
    assert [(line["grad_norm"], line["masked"]) for line in lines] == [(0.0, 1.0)] * 3
    assert run_control.read_eviction(runs["run_good"]) is None


def test_a_run_whose_advantages_are_all_0_is_not_evicted(tmp_path, tiny_llama):
    # Every group's rewards equal (all solved, or none): nothing to learn from those
    # batches, which is not a divergence. Without the KL term the gradient is exactly 0.
    runs = {"run_a": make_run(tmp_path, "run_a", GOOD + "loss = { kl_coef = 0.0 }\n")}
    trainer = make_trainer(tmp_path, tiny_llama)
    iterate_published(trainer)

    def nothing_to_learn(run_id, batch):
        for sample in batch.samples:
            sample.advantage = 0.0

    write_steps(trainer, runs, NON_FINITE_UPDATES + 1, nothing_to_learn)
    assert run_control.read_eviction(runs["run_a"]) is None
    assert [line["grad_norm"] for line in read_metrics(runs["run_a"], "trainer")] == [0.0] * 4


def test_non_finite_updates_that_are_not_in_a_row_are_skipped_and_the_run_goes_on(
    tmp_path, tiny_llama
):
    experiment = tmp_path / "exp"
    # Updates 2, 3 and 5: one bad batch, then two in a row, never three.
    trainer = train(experiment, tiny_llama, {"run_a": GOOD}, {"run_a": (2, 3, 5)})
    run = experiment / "run_a"
    finite = [math.isfinite(norm) for _, _, norm in trainer_lines(run)]
    assert finite == [True, False, False, True, False, True]
    assert run_control.read_eviction(run) is None
    assert trainer.manager.progress[trainer.manager.id_2_idx["run_a"]].step == STEPS
    assert sorted(adapters(run)) == [4, 5, 6]


def test_an_adapter_that_is_not_finite_is_never_written_and_its_run_is_evicted(
    tmp_path, tiny_llama, monkeypatch
):
    experiment = tmp_path / "exp"
    runs = {name: make_run(experiment, name, GOOD) for name in ("run_a", "run_b")}
    trainer = make_trainer(experiment, tiny_llama)
    iterate_published(trainer)
    for run_id, run in runs.items():
        write_rollouts(run, random_batch(run_id, 0, 6, seed=1))
    assert iterate_published(trainer) == "trained"
    idx = trainer.manager.id_2_idx["run_b"]
    # A finite update that still overflows float32 (or a weight decay that grows the
    # weights): the gradient is finite, the adapter after the step is not.
    _, param = trainer.manager.get_named_parameters_for_run(idx)[3]
    joint_step = optim.adamw_step_together  # every run's AdamW step at once

    def overflowing_step(optimizers):
        joint_step(optimizers)
        with torch.no_grad():
            param.view(-1)[0] = math.inf

    monkeypatch.setattr(optim, "adamw_step_together", overflowing_step)
    for run_id, run in runs.items():
        write_rollouts(run, random_batch(run_id, 1, 6, seed=1))
    assert iterate_published(trainer) == "trained"

    bad = runs["run_b"]
    reason = run_control.read_eviction(bad).reason
    assert reason.startswith("diverged: adapter weights not finite after update 2 (1 of ")
    assert run_control.run_condition(bad).status == "diverged"
    assert not layout.broadcast_dir(bad, 2).exists(), "not broadcast"
    assert layout.is_stable(layout.broadcast_dir(runs["run_a"], 2))
    assert run_control.read_eviction(runs["run_a"]) is None
    assert read_metrics(bad, "trainer")[-1]["step"] == 2, "its figures are still logged"
    iterate_published(trainer)  # it leaves; its leaving checkpoint is refused
    assert "run_b" not in trainer.manager.id_2_idx
    assert not layout.checkpoint_part_dir(bad, 2, PART).exists()


@pytest.mark.parametrize("what", ["adapter weights", "AdamW state"])
def test_a_checkpoint_with_a_non_finite_value_is_refused(tmp_path, tiny_llama, what):
    from workbench.trainer.runs.divergence import NonFiniteWeights

    experiment = tmp_path / "exp"
    run = make_run(experiment, "run_a", GOOD)
    trainer = make_trainer(experiment, tiny_llama)
    iterate_published(trainer)
    write_rollouts(run, random_batch("run_a", 0, 6, seed=1))
    assert iterate_published(trainer) == "trained"
    idx = trainer.manager.id_2_idx["run_a"]
    _, param = trainer.manager.get_named_parameters_for_run(idx)[0]
    with torch.no_grad():
        if what == "adapter weights":
            param.view(-1)[0] = math.nan
        else:
            trainer.optimizer.optimizers[idx].state[param]["exp_avg_sq"].view(-1)[0] = math.inf
    with pytest.raises(NonFiniteWeights, match=f"{what} not finite"):
        trainer.checkpointer.save(idx)
    assert not layout.checkpoint_part_dir(run, 1, PART).exists()


def test_the_finite_check_names_exactly_the_tensors_with_a_nan_or_an_infinity():
    # The fast path (one norm per tensor) must agree with the exact test, including values
    # so large that a norm overflows although every one is finite.
    huge = torch.full((4, 4), 1e20)
    tensors = {
        "fine": torch.randn(8, 8),
        "nan": torch.tensor([1.0, math.nan]),
        "huge": huge,
        "steps": torch.tensor(3, dtype=torch.int64),  # AdamW's step count
        "empty": torch.empty(0),
        "inf": torch.tensor([-math.inf]),
        "bf16": torch.randn(3, dtype=torch.bfloat16),
    }
    assert non_finite_names(tensors) == ["nan", "inf"]
    assert non_finite_names({"huge": huge, "steps": tensors["steps"]}) == []
    assert non_finite_names({"fine": tensors["fine"]}) == []
