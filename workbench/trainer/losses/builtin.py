"""The built-in policy losses, one function each, with the formulas they implement.

Notation (as in docs/guides/algorithms.md): per token, `lp` the trainer's
log-prob (carries the gradient), `lp_s` the sampler's, `r = exp(lp - lp_s)`, `A` the
advantage, `sg` stop-gradient. Each returns its per-token term; `compute_rl_loss` keeps the
loss tokens and aggregates per run. Knobs are the fields of the run's kind's class
(`workbench/config/loss.py`), with their defaults there.
"""

from __future__ import annotations

import torch

from workbench.trainer.losses import register_loss
from workbench.trainer.losses.inputs import MAX_ABS_LOG_RATIO, LossInputs, TokenLoss

# verl caps GSPO's log sequence ratio at 10 (`compute_policy_loss_gspo`).
MAX_LOG_SEQUENCE_RATIO = 10.0


@register_loss("default")
def masked_importance_sampling(inputs: LossInputs) -> TokenLoss:
    """prime-rl's masked importance sampling: `-r*A + kl_coef * (log r)^2 / 2` on kept tokens.

    A token whose ratio moved too far in its advantage's direction (r > mask_ratio_high
    with A > 0, r < mask_ratio_low with A < 0; with `mask_both_sides` any token outside the
    band) is masked, not clipped: it contributes nothing, since its sample no longer speaks
    for the current policy. A ratio beyond e^+-20 is always masked (exp would overflow).
    The penalty is the k2 estimator of KL(pi || pi_sampler)."""
    config, mask, advantages = inputs.config, inputs.loss_mask, inputs.advantages
    log_ratio = torch.where(mask, inputs.logprobs - inputs.sampler_logprobs, 0.0)
    ratio = torch.exp(log_ratio.detach())
    too_high = ratio > config.mask_ratio_high
    too_low = ratio < config.mask_ratio_low
    if config.mask_both_sides:
        out_of_band = too_high | too_low
    else:
        out_of_band = ((advantages > 0) & too_high) | ((advantages < 0) & too_low)
    absurd = log_ratio.detach().abs() > MAX_ABS_LOG_RATIO
    is_masked = mask & (out_of_band | absurd)
    keep = mask & ~is_masked
    # Zero a dropped token's log-ratio before exp: it may overflow, and 0 * inf in the
    # backward would turn every gradient into nan.
    kept_log_ratio = torch.where(keep, log_ratio, 0.0)
    per_token = -torch.exp(kept_log_ratio) * advantages
    per_token = per_token + config.kl_coef * kept_log_ratio.square() / 2
    return TokenLoss(torch.where(keep, per_token, 0.0), clipped=is_masked)


@register_loss("ppo")
def ppo_clip(inputs: LossInputs) -> TokenLoss:
    """verl `vanilla`: `max(-A*r, -A*clip(r, 1 - eps_low, 1 + eps_high))`; with `dual_clip`
    c, for A < 0 only, `min(that, -A*c)` (for A > 0 it would blow the loss up)."""
    config, advantages = inputs.config, inputs.advantages
    ratio = torch.exp(inputs.log_ratio())
    low, high = 1 - config.eps_low, 1 + config.eps_high
    unclipped = -advantages * ratio
    clipped_term = -advantages * ratio.clamp(low, high)
    per_token = torch.maximum(unclipped, clipped_term)
    clipped = clipped_term > unclipped
    dual_clip = config.dual_clip
    if dual_clip is not None:
        bound = -advantages * dual_clip
        negative = advantages < 0
        clipped = clipped | (negative & (per_token > bound))
        per_token = torch.where(negative, torch.minimum(per_token, bound), per_token)
    return TokenLoss(per_token, clipped=clipped & inputs.loss_mask)


@register_loss("gspo")
def gspo(inputs: LossInputs) -> TokenLoss:
    """GSPO, verl's token form: `s_i = exp(mean_t log r)` over completion i's loss tokens;
    each token carries `log s_it = lp - sg(lp) + sg(log s_i)` (value s_i, gradient s_i times
    the token's), capped at 10, then PPO's clip on s with `eps_low` / `eps_high`."""
    config, mask, advantages = inputs.config, inputs.loss_mask, inputs.advantages
    sequence_log_ratio = inputs.per_sample_sum(
        inputs.log_ratio()
    ) / inputs.sample_loss_tokens().clamp_min(1.0)
    own_gradient = torch.where(mask, inputs.logprobs - inputs.logprobs.detach(), 0.0)
    log_ratio = own_gradient + sequence_log_ratio.detach()[inputs.sample_index]
    ratio = torch.exp(log_ratio.clamp(max=MAX_LOG_SEQUENCE_RATIO))
    low, high = 1 - config.eps_low, 1 + config.eps_high
    unclipped = -advantages * ratio
    clipped_term = -advantages * ratio.clamp(low, high)
    per_token = torch.maximum(unclipped, clipped_term)
    return TokenLoss(per_token, clipped=(clipped_term > unclipped) & mask)


@register_loss("cispo")
def cispo(inputs: LossInputs) -> TokenLoss:
    """CISPO (MiniMax-M1), Tinker's bounds: `-sg(clip(r, weight_low, weight_high)) * A * lp`.
    Every token keeps a gradient, `clip(r) * A * grad(lp)`; only its weight is bounded."""
    config, mask = inputs.config, inputs.loss_mask
    ratio = torch.exp(inputs.log_ratio().detach())
    low, high = config.weight_low, config.weight_high
    weight = ratio.clamp(low, high)
    logprobs = torch.where(mask, inputs.logprobs, 0.0)
    per_token = -weight * inputs.advantages * logprobs
    return TokenLoss(per_token, clipped=mask & ((ratio < low) | (ratio > high)))


@register_loss("is")
def importance_sampling(inputs: LossInputs) -> TokenLoss:
    """Tinker `importance_sampling`: `-r * A`, unclipped (log r clamped to +-20)."""
    return TokenLoss(-torch.exp(inputs.log_ratio()) * inputs.advantages)


@register_loss("reinforce")
def reinforce(inputs: LossInputs) -> TokenLoss:
    """verl `gpg`: `-A * lp`, no ratio: no correction for a sampler that lags the trainer."""
    return TokenLoss(-inputs.advantages * torch.where(inputs.loss_mask, inputs.logprobs, 0.0))
