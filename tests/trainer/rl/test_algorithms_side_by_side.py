"""Runs of different loss kinds, aggregations and KL terms in one trainer: one packed update
for all, each run's adapter gradient the one it gets trained alone, its diagnostics logged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import (
    assert_same_gradients,
    gradients_at_each_update,
    iterate_published,
    make_run,
    random_batch,
)
from workbench.config import ModelSection, TrainerConfig, TrainerSection
from workbench.files import run_control
from workbench.files.metrics import read_metrics
from workbench.files.rollouts import write_rollouts
from workbench.trainer.rl import trainer as rl
from workbench.trainer.rl.trainer import build_trainer, load_base_model

# Every kind once, with the aggregations and a KL term to the base spread over them.
RUNS = {
    "run_default": "lr = 0.01\n",
    "run_ppo": 'lr = 0.01\n[loss]\nkind = "ppo"\neps_high = 0.28\ndual_clip = 3.0\n',
    "run_gspo": 'lr = 0.01\n[loss]\nkind = "gspo"\neps_low = 0.2\neps_high = 0.2\n',
    "run_cispo": 'lr = 0.01\n[loss]\nkind = "cispo"\naggregation = "constant"\n',
    "run_is": 'lr = 0.01\n[loss]\nkind = "is"\nbase_kl_coef = 0.5\nbase_kl_estimator = "k3"\n',
    "run_reinforce": 'lr = 0.01\n[loss]\nkind = "reinforce"\naggregation = "sequence_mean"\n'
    'base_kl_coef = 0.2\nbase_kl_estimator = "k2"\n',
    "run_custom": 'lr = 0.01\n[loss]\nkind = "tests.trainer.custom_loss:scaled_reinforce"\n'
    "args = { scale = 2.0, cap = 1.5 }\n",
}
UPDATES = 2  # the KL terms act from the second: at the first every adapter is 0


def train(experiment: Path, model_dir: Path, run_ids: list[str]) -> dict:
    """`UPDATES` updates of `run_ids` in one trainer (rows of 64 tokens: a run's batch spans
    several); the gradients of the last update by `{run_id}/{param}`."""
    runs = [make_run(experiment, run_id, RUNS[run_id]) for run_id in run_ids]
    config = TrainerConfig(
        output_dir=experiment,
        model=ModelSection(base=str(model_dir)),
        trainer=TrainerSection(max_concurrent_runs=len(RUNS), seq_len=64),
    )
    model = load_base_model(str(model_dir), torch.float32, torch.device("cpu"))
    trainer = build_trainer(config, model, torch.device("cpu"))
    gradients = gradients_at_each_update(trainer)
    for step in range(UPDATES):
        for run in runs:
            write_rollouts(run, random_batch(run.name, step, 8, seed=3))
        assert iterate_published(trainer) == "trained"
    return gradients


def test_each_kind_trains_beside_the_others_as_it_trains_alone(tmp_path: Path, tiny_llama):
    together = train(tmp_path / "together", tiny_llama, list(RUNS))
    for run_id in RUNS:
        alone = train(tmp_path / run_id, tiny_llama, [run_id])
        own = {key: grad for key, grad in together.items() if key.startswith(f"{run_id}/")}
        assert_same_gradients(own, alone)


def test_each_runs_metrics_name_its_loss_and_its_diagnostics(experiment: Path, tiny_llama):
    train(experiment, tiny_llama, list(RUNS))
    lines = {run_id: read_metrics(experiment / run_id, "trainer")[-1] for run_id in RUNS}
    assert lines["run_ppo"]["loss_kind"] == "ppo"
    assert lines["run_custom"]["loss_kind"] == "tests.trainer.custom_loss:scaled_reinforce"
    for run_id, line in lines.items():
        assert line["step"] == UPDATES
        assert 0 <= line["clipped"] <= 1 and line["clipped"] == line["masked"]
        assert 0 < line["ratio_min"] <= line["ratio_mean"] <= line["ratio_max"], run_id
    # Only runs with a KL term to the base log it, and it is positive once adapters moved.
    assert lines["run_is"]["base_kl"] > 0 and lines["run_reinforce"]["base_kl"] > 0
    assert "base_kl" not in lines["run_ppo"]
    # The kinds without a trust region never clip; the ratio kinds here do.
    assert lines["run_is"]["clipped"] == 0 and lines["run_reinforce"]["clipped"] == 0
    assert lines["run_default"]["clipped"] > 0 and lines["run_ppo"]["clipped"] > 0


def test_the_base_forward_runs_only_for_rows_with_a_kl_run(
    experiment: Path, tiny_llama, monkeypatch: pytest.MonkeyPatch
):
    entered = []
    original = rl.adapters_disabled

    def counting(model):
        entered.append(1)
        return original(model)

    monkeypatch.setattr(rl, "adapters_disabled", counting)
    train(experiment, tiny_llama, ["run_default", "run_ppo"])
    assert entered == []
    train(experiment / "with_kl", tiny_llama, ["run_is"])
    assert entered


@pytest.mark.parametrize(
    ("function", "reason"),
    [
        ("raises", "raised RuntimeError: my loss is broken"),
        ("wrong_shape", "TokenLoss.loss must be a tensor of shape (7,)"),
    ],
)
def test_a_users_loss_that_fails_rejects_its_run_and_the_others_train(
    experiment: Path, tiny_llama, function: str, reason: str
):
    broken = make_run(
        experiment, "run_broken", f'[loss]\nkind = "tests.trainer.custom_loss:{function}"\n'
    )
    gradients = train(experiment, tiny_llama, ["run_ppo", "run_cispo"])
    assert {key.split("/")[0] for key in gradients} == {"run_ppo", "run_cispo"}
    assert reason in run_control.read_validation_error(broken)
