"""A run's loss through the trainer's own packer and update when its batch spans several
packed rows, and a GSPO run whose importance ratios overflow float32."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import (
    assert_same_gradients,
    gradients_at_each_update,
    iterate_published,
    make_run,
    random_batch,
)
from workbench.config import ModelSection, TrainerConfig, TrainerSection
from workbench.files import layout, run_control
from workbench.files.metrics import read_metrics
from workbench.files.rollouts import write_rollouts
from workbench.trainer.rl.trainer import build_trainer, load_base_model

# One run per aggregation (GSPO's is sequence_mean, by verl's rule).
RUNS = {
    "run_sequence_mean": 'lr = 0.01\n[loss]\nkind = "reinforce"\naggregation = "sequence_mean"\n',
    "run_gspo": 'lr = 0.01\n[loss]\nkind = "gspo"\neps_low = 0.2\neps_high = 0.2\n',
    "run_constant": 'lr = 0.01\n[loss]\nkind = "cispo"\naggregation = "constant"\n',
    "run_constant_set": 'lr = 0.01\n[loss]\nkind = "ppo"\naggregation = "constant"\n'
    "normaliser = 40.0\n",
    "run_token_mean": "lr = 0.01\n",
}
UPDATES = 2  # lora_A's gradients are 0 at the first (every lora_B is 0)
# The gradients of the first update are compared: packed otherwise, the same float32 terms
# sum in another order, and AdamW's first update, dividing each gradient by its own size,
# turns that rounding into adapters a few 1e-5 apart (as between two packings of several
# rows each), far above what a wrong count would leave.
COMPARED_UPDATES = 1
SAMPLES = 12  # 2-6 prompt and 1-8 completion tokens each: 40-170 tokens a run


def make_trainer(experiment: Path, model_dir: Path, seq_len: int):
    config = TrainerConfig(
        output_dir=experiment,
        model=ModelSection(base=str(model_dir)),
        trainer=TrainerSection(max_concurrent_runs=len(RUNS), seq_len=seq_len),
    )
    model = load_base_model(str(model_dir), torch.float32, torch.device("cpu"))
    return build_trainer(config, model, torch.device("cpu"))


def train(
    experiment: Path, model_dir: Path, run_id: str, seq_len: int, updates: int = UPDATES
) -> tuple[dict, int]:
    """`updates` updates of one run in rows of `seq_len` tokens: its gradients of the last
    update, and the most rows its batch was packed into."""
    run = make_run(experiment, run_id, RUNS[run_id])
    trainer = make_trainer(experiment, model_dir, seq_len)
    gradients = gradients_at_each_update(trainer)
    rows = []
    pack = trainer.packer.pack

    def pack_and_count(*args, **kwargs):
        shares = pack(*args, **kwargs)
        rows.append(sum(len(share) for share in shares))
        return shares

    trainer.packer.pack = pack_and_count
    for step in range(updates):
        write_rollouts(run, random_batch(run_id, step, SAMPLES, seed=4))
        assert iterate_published(trainer) == "trained"
    return gradients, max(rows)


@pytest.mark.parametrize("run_id", list(RUNS))
def test_a_runs_batch_over_several_rows_trains_as_in_one(tmp_path: Path, tiny_llama, run_id):
    """Each row's loss is divided by the run's counts over the whole step (its loss tokens,
    its completions, or its constant), so the gradients summed over rows are those of the
    batch packed into one row."""
    one, one_rows = train(tmp_path / "one", tiny_llama, run_id, 256, COMPARED_UPDATES)
    several, several_rows = train(tmp_path / "several", tiny_llama, run_id, 16, COMPARED_UPDATES)
    assert one_rows == 1 and several_rows >= 4, (one_rows, several_rows)
    assert_same_gradients(several, one)


def test_a_gspo_run_whose_ratios_overflow_trains_on_with_a_finite_loss(experiment, tiny_llama):
    """Half the completions have a sampler log-prob of -10,000 on every token (a valid
    batch: finite, not above 0), so the trainer's ratio exp(lp - lp_s) overflows float32.
    GSPO caps each completion's log-ratio (at 20 a token, 10 a sequence): the loss and
    gradient stay finite, the run is not evicted, its adapter is finite, and the capped
    completions give no gradient, so the others still train it."""
    run = make_run(experiment, "run_gspo", RUNS["run_gspo"])
    trainer = make_trainer(experiment, tiny_llama, seq_len=64)
    gradients = gradients_at_each_update(trainer)
    for step in range(UPDATES):
        batch = random_batch("run_gspo", step, SAMPLES, seed=5)
        for sample in batch.samples[::2]:
            sample.completion_logprobs = [-1e4] * len(sample.completion_logprobs)
        write_rollouts(run, batch)
        assert iterate_published(trainer) == "trained"
    assert run_control.read_eviction(run) is None
    line = read_metrics(run, "trainer")[-1]
    assert line["step"] == UPDATES
    assert math.isfinite(line["loss"]) and math.isfinite(line["grad_norm"]), line
    assert line["grad_norm"] > 0, line
    assert all(torch.isfinite(grad).all() for grad in gradients.values())
    assert any(grad.abs().max() > 0 for grad in gradients.values())
    adapter = load_file(layout.broadcast_dir(run, UPDATES) / "adapter_model.safetensors")
    assert all(torch.isfinite(tensor).all() for tensor in adapter.values())
