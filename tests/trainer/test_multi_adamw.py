"""All runs' clipping and AdamW step at once (workbench.trainer.optim.multi_adamw) give the very
tensors that each run's own `clip_grad_norm_` and `AdamW.step()` give."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.optim import AdamW

from workbench.trainer.optim.multi_adamw import (
    adamw_step_together,
    clip_grad_norms_together,
    steps_together,
)

# Runs as a sweep makes them: their own learning rate, betas, eps, weight decay, max_norm.
SETTINGS = [
    dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, max_norm=1.0),
    dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01, max_norm=0.05),
    dict(lr=5e-4, betas=(0.95, 0.98), eps=1e-8, weight_decay=0.1, max_norm=100.0),
]


def run_params(seed: int) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(8, 32), (48, 8), (8, 32), (32, 8)]  # lora_A and lora_B of two layers
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in shapes]


def optimizers_for(runs: list[list[torch.nn.Parameter]]) -> list[AdamW]:
    return [
        AdamW(params, **{k: v for k, v in settings.items() if k != "max_norm"})
        for params, settings in zip(runs, SETTINGS, strict=True)
    ]


def give_gradients(runs: list[list[torch.nn.Parameter]], step: int, skip: int | None) -> None:
    generator = torch.Generator().manual_seed(100 + step)
    for index, params in enumerate(runs):
        for position, param in enumerate(params):
            # Some gradients large enough to clip; one run's B matrix without a gradient.
            scale = 10.0 if index == 1 else 0.1
            grad = torch.randn(param.shape, generator=generator) * scale
            param.grad = None if (index == skip and position == 1) else grad


@pytest.mark.parametrize("foreach", [False, True], ids=["per-tensor", "foreach"])
def test_all_runs_at_once_match_each_run_stepping_alone_bit_for_bit(foreach: bool):
    alone = [run_params(seed) for seed in range(len(SETTINGS))]
    together = copy.deepcopy(alone)
    alone_optimizers, together_optimizers = optimizers_for(alone), optimizers_for(together)
    assert all(steps_together(optimizer) for optimizer in together_optimizers)
    for step in range(4):
        skip = 2 if step == 1 else None
        give_gradients(alone, step, skip)
        give_gradients(together, step, skip)
        expected = {}
        for index, (params, optimizer) in enumerate(zip(alone, alone_optimizers, strict=True)):
            max_norm = SETTINGS[index]["max_norm"]
            expected[index] = torch.nn.utils.clip_grad_norm_(params, max_norm).item()
            optimizer.step()
        norms = clip_grad_norms_together(
            dict(enumerate(together)), {i: s["max_norm"] for i, s in enumerate(SETTINGS)}
        )
        adamw_step_together(together_optimizers, foreach=foreach)
        assert norms == expected
        for params_alone, params_together in zip(alone, together, strict=True):
            for a, b in zip(params_alone, params_together, strict=True):
                assert torch.equal(a, b)
                assert torch.equal(a.grad, b.grad) if a.grad is not None else b.grad is None
    # The state is AdamW's own: the checkpoint of one loads into the other.
    for mine, theirs in zip(together_optimizers, alone_optimizers, strict=True):
        ours, reference = mine.state_dict(), theirs.state_dict()
        assert ours["param_groups"] == reference["param_groups"]
        for key, state in reference["state"].items():
            for name, value in state.items():
                assert torch.equal(ours["state"][key][name], value), name


def test_an_optimizer_with_options_it_does_not_compute_steps_alone():
    assert not steps_together(AdamW(run_params(0), amsgrad=True))
    assert not steps_together(AdamW(run_params(0), lr=torch.tensor(1e-3)))
