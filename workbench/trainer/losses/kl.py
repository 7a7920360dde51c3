"""KL estimators of a token's divergence from the base model (the adapter switched off).

With `d = lp - lp_base` (verl `kl_penalty_forward`): k1 = d; k2 = d^2 / 2; k3 =
exp(-d) + d - 1 with d clamped to +-20 and the result to [-10, 10] (verl's low_var_kl)."""

from __future__ import annotations

import torch

MAX_ABS_K3_INPUT = 20.0
MAX_ABS_K3 = 10.0


def kl_estimate(
    logprobs: torch.Tensor, base_logprobs: torch.Tensor, estimator: str
) -> torch.Tensor:
    """Per token, the chosen estimator of KL(pi || pi_base); callers keep the loss tokens."""
    difference = logprobs - base_logprobs
    if estimator == "k1":
        return difference
    if estimator == "k2":
        return difference.square() / 2
    if estimator == "k3":
        difference = difference.clamp(-MAX_ABS_K3_INPUT, MAX_ABS_K3_INPUT)
        return (torch.exp(-difference) + difference - 1).clamp(-MAX_ABS_K3, MAX_ABS_K3)
    raise ValueError(f"unknown KL estimator {estimator!r}; choose k1, k2 or k3")
