"""A loss written by a user, as `loss.kind = "tests.trainer.custom_loss:scaled_reinforce"`
names it: the docs' example, run by the tests."""

from __future__ import annotations

import torch

from workbench.trainer.losses import LossInputs, TokenLoss


def scaled_reinforce(inputs: LossInputs) -> TokenLoss:
    """REINFORCE with its advantages scaled by `loss.args.scale` (default 1) and its
    importance weight capped at `loss.args.cap` (default 2), stop-gradient."""
    scale = float(inputs.args.get("scale", 1.0))
    cap = float(inputs.args.get("cap", 2.0))
    weight = torch.exp(inputs.log_ratio()).clamp(max=cap).detach()
    logprobs = torch.where(inputs.loss_mask, inputs.logprobs, 0.0)
    return TokenLoss(-scale * weight * inputs.advantages * logprobs, clipped=weight >= cap)


def two_arguments(inputs, other):  # the wrong signature, for the config's check
    raise AssertionError("never called")


def raises(inputs):  # loads and takes one argument, but fails when called
    raise RuntimeError("my loss is broken")


def wrong_shape(inputs):
    return TokenLoss(inputs.logprobs.sum())
