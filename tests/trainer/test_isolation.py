"""Run isolation, our promise beyond the seeds: run A trains the same alone and beside run B."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.trainer.builders import (
    TinyTrainer,
    build_trainer,
    packed_inputs,
    packed_logits,
    tiny_llama,
)
from workbench.trainer.compute.lm_head import compute_logprobs
from workbench.trainer.rl.loss import compute_rl_loss

PROMPT_TOKENS = 2


@dataclass
class Sample:
    input_ids: torch.Tensor
    inference_logprobs: torch.Tensor
    advantage: float

    @property
    def loss_mask(self) -> torch.Tensor:
        mask = torch.ones(len(self.input_ids), dtype=torch.bool)
        mask[:PROMPT_TOKENS] = False
        return mask


def make_samples(
    generator: torch.Generator, lengths: list[int], advantage_scale: float
) -> list[Sample]:
    """Samples whose inference log-probs are the untrained model's plus noise, with one
    token pushed far enough off that the loss masks it."""
    reference = tiny_llama(seed=0)
    samples = []
    for length in lengths:
        input_ids = torch.randint(0, 64, (length,), generator=generator)
        with torch.no_grad():
            logits = reference(input_ids=input_ids[None], use_cache=False).logits[0]
        inference = compute_logprobs(logits, input_ids)
        inference = inference + 0.2 * torch.randn(length, generator=generator)
        inference[-1] -= 4.0  # ratio about e^4 > 8: masked
        advantage = advantage_scale * torch.randn((), generator=generator).item()
        samples.append(Sample(input_ids, inference, advantage))
    return samples


def train_step(trainer: TinyTrainer, batches: dict[str, list[Sample]]) -> dict[int, float]:
    """One step of the real loop on one packed micro-batch: the runs' samples in slot order."""
    manager = trainer.manager
    by_slot = {trainer.slot(run_id): samples for run_id, samples in batches.items()}
    counts = [
        sum(len(s.input_ids) for s in by_slot.get(idx, [])) for idx in range(manager.max_runs)
    ]
    ordered = [sample for idx in sorted(by_slot) for sample in by_slot[idx]]
    for idx in range(manager.max_runs):
        manager.ready_to_update[idx] = idx in by_slot

    logits = packed_logits(trainer.model, [s.input_ids for s in ordered], counts)
    input_ids = torch.cat([s.input_ids for s in ordered])
    result = compute_rl_loss(
        trainer_logprobs=compute_logprobs(logits[0], input_ids),
        inference_logprobs=torch.cat([s.inference_logprobs for s in ordered]),
        advantages=torch.cat([torch.full((len(s.input_ids),), s.advantage) for s in ordered]),
        loss_mask=torch.cat([s.loss_mask for s in ordered]),
        lora_num_tokens=torch.tensor(counts),
        loss_config=[
            manager.config[idx].loss if idx in manager.config else None
            for idx in range(manager.max_runs)
        ],
    )
    assert (result.masked_fraction[sorted(by_slot)] > 0).all(), "no token was masked"
    result.loss.backward()
    norms = trainer.optimizer.step()
    trainer.scheduler.step()
    trainer.optimizer.zero_grad()
    return norms


RUN_A = """
lr = 1e-3
seed = 1
[optim]
max_norm = 1000.0
[scheduler]
kind = "cosine"
warmup_steps = 1
"""
# Louder in every way: advantages 1000x larger, 100x the learning rate, its own clipping.
RUN_B = """
lr = 1e-1
seed = 2
[optim]
max_norm = 0.5
[loss]
kl_coef = 0.1
"""


def test_packed_samples_do_not_attend_across_boundaries():
    model = tiny_llama(seed=0)
    first, second = torch.arange(3, 10), torch.arange(20, 31)
    other_second = torch.arange(40, 51)

    def logits_of(samples):
        input_ids, position_ids = packed_inputs(samples)
        return model(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits[0]

    alone = model(input_ids=second[None], use_cache=False).logits[0]
    packed = logits_of([first, second])
    torch.testing.assert_close(packed[len(first) :], alone, rtol=1e-5, atol=1e-6)
    # The first sample's logits do not move when the sample packed after it changes.
    torch.testing.assert_close(
        logits_of([first, other_second])[: len(first)], packed[: len(first)], rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("path", ["grouped", "plain"])
def test_run_a_trains_the_same_alone_as_beside_a_loud_run_b(tmp_path: Path, path: str):
    generator = torch.Generator().manual_seed(1234)
    steps = [
        {
            "run_a": make_samples(generator, [6, 9, 5], advantage_scale=1.0),
            "run_b": make_samples(generator, [7, 8], advantage_scale=1000.0),
        }
        for _ in range(3)
    ]
    # B's config is written first, so A sits in slot 1 beside B and in slot 0 alone.
    together = build_trainer(tmp_path / "together", {"run_b": RUN_B, "run_a": RUN_A}, path=path)
    alone = build_trainer(tmp_path / "alone", {"run_a": RUN_A}, path=path)
    assert together.slot("run_a") == 1 and alone.slot("run_a") == 0
    initial = alone.manager.get_state_dict_for_run(0)

    for batches in steps:
        norms_together = train_step(together, batches)
        norms_alone = train_step(alone, {"run_a": batches["run_a"]})
        assert norms_together[1] == pytest.approx(norms_alone[0], rel=1e-5)
        # B's norm is far past its max_norm (clipped), A's below its own (untouched).
        assert norms_together[0] > 100 * together.manager.config[0].optim.max_norm
        assert norms_together[1] < together.manager.config[1].optim.max_norm

    a_together = together.manager.get_state_dict_for_run(together.slot("run_a"))
    a_alone = alone.manager.get_state_dict_for_run(alone.slot("run_a"))
    for key, tensor in a_alone.items():
        torch.testing.assert_close(a_together[key], tensor, rtol=1e-5, atol=1e-7)
    assert any(not torch.equal(a_alone[k], initial[k]) for k in initial), "A did not train"
    assert together.scheduler.get_last_lr(1) == alone.scheduler.get_last_lr(0)
    assert together.scheduler.get_last_lr(0) != together.scheduler.get_last_lr(1)
