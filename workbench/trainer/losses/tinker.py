"""Tinker's built-in losses: per-token terms of one datum, aggregated by a plain SUM.

As Tinker documents them (tinker-docs /tinker/losses)
and as SkyRL's Tinker server implements them (`skyrl/tinker/loss_fns.py`): every term is
multiplied by the datum's `weights` (SkyRL's `loss_mask`; all ones when the datum has none)
and the loss of a datum is the sum of its terms, never a mean. Notation: `lp` the trainer's
log-prob of the target token (carries the gradient), `lp_s` the sampler's (`logprobs` of the
datum), `r = exp(lp - lp_s)`, `A` the advantage, `sg` stop-gradient, `w` the weight:

    cross_entropy        -w * lp
    importance_sampling  -w * r * A
    ppo                  -w * min(r * A, clip(r, low, high) * A)
    cispo                -w * sg(clip(r, low, high)) * lp * A
    dro                  -w * (lp * A - beta / 2 * (lp - lp_s) ** 2)

`low` / `high` are the datum's `clip_low_threshold` / `clip_high_threshold` tensors where it
carries them, else `loss_fn_config`'s keys of those names, else 0.8 / 1.2 (Tinker's PPO
epsilon of 0.2). `dro` (tinker-docs /tinker/losses/dro: Richemond et al. 2024, the
quadratic penalty on the log-ratio; its "soft" advantages are the client's) takes `beta`
from `loss_fn_config`, which must name it: Tinker documents no default (its example: 0.05).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

TINKER_LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro")
DEFAULT_CLIP_LOW = 0.8
DEFAULT_CLIP_HIGH = 1.2
# What each loss reads from the datum besides its target tokens (`weights` is optional).
NEEDS: dict[str, tuple[str, ...]] = {
    "cross_entropy": (),
    "importance_sampling": ("advantages", "logprobs"),
    "ppo": ("advantages", "logprobs"),
    "cispo": ("advantages", "logprobs"),
    "dro": ("advantages", "logprobs"),
}
# The loss_fn_config keys each loss reads.
CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "cross_entropy": (),
    "importance_sampling": (),
    "ppo": ("clip_low_threshold", "clip_high_threshold"),
    "cispo": ("clip_low_threshold", "clip_high_threshold"),
    "dro": ("beta",),
}


def tinker_loss_problem(loss_fn: str, names: set[str], config: Mapping[str, float]) -> str | None:
    """Why a datum with tensors `names` cannot take `loss_fn` with `config`, or None."""
    if loss_fn not in TINKER_LOSSES:
        return f"loss_fn {loss_fn!r} is not supported by this trainer (one of {', '.join(TINKER_LOSSES)})"
    missing = [name for name in NEEDS[loss_fn] if name not in names]
    if missing:
        return f"loss_fn {loss_fn!r} needs loss_fn_inputs {', '.join(missing)}"
    known = CONFIG_KEYS[loss_fn]
    unknown = set(config) - set(known)
    if unknown:
        return (
            f"loss_fn_config keys {sorted(unknown)} are not read by {loss_fn!r} "
            f"(it reads: {', '.join(known) or 'none'})"
        )
    if loss_fn == "dro" and "beta" not in config:
        return "loss_fn 'dro' needs loss_fn_config={'beta': ...} (Tinker's example: 0.05)"
    return None


def tinker_token_losses(
    loss_fn: str,
    logprobs: torch.Tensor,
    inputs: Mapping[str, torch.Tensor],
    config: Mapping[str, float] | None = None,
) -> torch.Tensor:
    """Each target token's loss term [T] (already times its weight); the datum's loss is
    their sum. `logprobs` [T] are the trainer's, with the gradient; `inputs` the datum's
    float tensors (`weights`, `advantages`, `logprobs`, clip thresholds), each [T]."""
    weights = inputs.get("weights")
    if weights is None:
        weights = torch.ones_like(logprobs)
    if loss_fn == "cross_entropy":
        return -weights * logprobs
    advantages = inputs["advantages"]
    if loss_fn == "dro":
        penalty = (logprobs - inputs["logprobs"]) ** 2
        beta = float((config or {})["beta"])
        return -weights * (logprobs * advantages - 0.5 * beta * penalty)
    ratio = torch.exp(logprobs - inputs["logprobs"])
    if loss_fn == "importance_sampling":
        return -weights * (ratio * advantages)
    low, high = _clip_thresholds(logprobs, inputs, config or {})
    clipped_ratio = torch.minimum(torch.maximum(ratio, low), high)
    if loss_fn == "ppo":
        return -weights * torch.minimum(ratio * advantages, clipped_ratio * advantages)
    if loss_fn == "cispo":
        return -weights * (clipped_ratio.detach() * logprobs * advantages)
    raise ValueError(f"loss_fn {loss_fn!r} is not one of {', '.join(TINKER_LOSSES)}")


def _clip_thresholds(
    logprobs: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: the datum's thresholds, else the config's, else Tinker's defaults."""
    thresholds = []
    for name, default in (
        ("clip_low_threshold", DEFAULT_CLIP_LOW),
        ("clip_high_threshold", DEFAULT_CLIP_HIGH),
    ):
        value = inputs.get(name)
        if value is None:
            value = torch.full_like(logprobs, float(config.get(name, default)))
        thresholds.append(value.to(logprobs.dtype))
    return thresholds[0], thresholds[1]
