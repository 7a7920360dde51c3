"""The RL policy loss over a packed multi-run micro-batch, and token log-probabilities.

The loss follows prime-rl's default, masked importance sampling: the importance ratio
r = exp(logp - old_logp) between the trainer's and the inference server's log-probs
weights each token's advantage, and a token whose probability moved too far in its
advantage's direction (r > mask_ratio_high with A > 0, r < mask_ratio_low with A < 0) is
*masked* (contributes nothing) rather than *clipped* as in PPO; `mask_both_sides` masks
every token outside the band, as prime-rl does. A
clipped token keeps pushing with a bounded weight although its sample is no longer
trustworthy evidence about the current policy; masking drops it. Per kept token:

    loss_t = -r_t * A_t + kl_coef * (logp_t - old_logp_t)^2 / 2

The penalty is the k2 estimator of KL(pi || pi_old). Its gradient, kl_coef * log r_t *
grad logp_t, is what prime-rl's `kl_tau` term gives on kept tokens up to the factor r_t
(close to 1 there); unlike k3 (r - 1 - log r) it does not grow exponentially with the
ratio, and unlike k1 (log r) it cannot go negative. Masked and non-loss tokens get neither
term, as in prime-rl.

Run isolation: each run's loss is the sum over its tokens divided by its own number of
loss tokens, and the total is the plain sum over runs, so no run's token count or loss
scale changes another run's gradient. The per-token thresholds and penalty come from each
run's own `LossConfig`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from workbench.config import LossConfig
from workbench.trainer.transfer import to_device

MAX_ABS_LOG_RATIO = 20.0


@dataclass
class RLLossOutput:
    """`loss` is what to backward; the per-run tensors (one entry per slot) are for logging."""

    loss: torch.Tensor
    run_loss: torch.Tensor
    masked_fraction: torch.Tensor
    mean_ratio: torch.Tensor
    loss_tokens: torch.Tensor
    masked_tokens: torch.Tensor
    # Loss tokens whose advantage is not 0: the ones that can move the adapter.
    advantaged_tokens: torch.Tensor


def compute_rl_loss(
    trainer_logprobs: torch.Tensor,
    inference_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    lora_num_tokens: torch.Tensor,
    loss_config: LossConfig | Sequence[LossConfig | None] | None = None,
    loss_tokens_per_run: torch.Tensor | None = None,
) -> RLLossOutput:
    """Loss of one packed micro-batch whose tokens are contiguous per run, in slot order.

    Per-token inputs may be [T] or [1, T]. `loss_config` is one config for every run or one
    per slot (None for a free slot). `loss_tokens_per_run` is each run's loss-token count
    over the whole step; pass it when a run's batch spans several micro-batches (or ranks
    whose gradients are summed) so every token of the run has the same weight. Without it
    this micro-batch's counts are used. The per-run statistics cover this micro-batch.
    """
    logprobs = trainer_logprobs.reshape(-1).float()
    device = logprobs.device
    old_logprobs = to_device(inference_logprobs.reshape(-1).float(), device)
    advantages = to_device(advantages.reshape(-1).float(), device)
    loss_mask = to_device(loss_mask.reshape(-1).bool(), device)
    # The counts are read on the host (as the packer made them): expanding counts that
    # live on a GPU would wait for them, a sync per micro-batch.
    counts = torch.as_tensor(lora_num_tokens, dtype=torch.long).cpu()
    n_runs = counts.numel()
    if not logprobs.numel() == old_logprobs.numel() == advantages.numel() == loss_mask.numel():
        raise ValueError(
            "trainer_logprobs, inference_logprobs, advantages and loss_mask need one value per "
            f"token; got {logprobs.numel()}, {old_logprobs.numel()}, {advantages.numel()}, "
            f"{loss_mask.numel()}"
        )
    total = int(counts.sum())
    if total != logprobs.numel():
        raise ValueError(f"lora_num_tokens sums to {total} but there are {logprobs.numel()} tokens")
    run_of_token = torch.repeat_interleave(
        torch.arange(n_runs, device=device), to_device(counts, device), output_size=total
    )

    low, high, kl_coef, both_sides = _per_run_settings(loss_config, n_runs, logprobs.device)
    log_ratio = torch.where(loss_mask, logprobs - old_logprobs, 0.0)
    ratio = torch.exp(log_ratio.detach())
    too_high = ratio > high[run_of_token]
    too_low = ratio < low[run_of_token]
    # Masked: tokens whose probability moved too far in their advantage's direction (up for
    # A > 0, down for A < 0): the update already went that way and the sample no longer
    # speaks for the current policy. With mask_both_sides, any token outside the band
    # (prime-rl's masked importance sampling). Either way a ratio beyond e^+-20 is masked:
    # it means the sample is unusable, and exp() of it would overflow.
    both = both_sides[run_of_token]
    moved_with_advantage = ((advantages > 0) & too_high) | ((advantages < 0) & too_low)
    outside_band = too_high | too_low
    absurd = log_ratio.detach().abs() > MAX_ABS_LOG_RATIO
    is_masked = loss_mask & (torch.where(both, outside_band, moved_with_advantage) | absurd)
    keep = loss_mask & ~is_masked
    # Zero the log-ratio of dropped tokens before exp: a masked token's ratio may overflow,
    # and 0 * inf in the backward would turn every gradient into nan.
    kept_log_ratio = torch.where(keep, log_ratio, 0.0)
    per_token = -torch.exp(kept_log_ratio) * advantages
    per_token = per_token + kl_coef[run_of_token] * kept_log_ratio.square() / 2
    per_token = torch.where(keep, per_token, 0.0)

    def per_run_sum(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(n_runs).index_add(0, run_of_token, values)

    micro_loss_tokens = per_run_sum(loss_mask.float())
    if loss_tokens_per_run is None:
        normaliser = micro_loss_tokens
    else:
        normaliser = to_device(torch.as_tensor(loss_tokens_per_run).float(), device)
    run_loss = per_run_sum(per_token) / normaliser.clamp_min(1.0)
    with torch.no_grad():
        seen = micro_loss_tokens.clamp_min(1.0)
        masked_tokens = per_run_sum(is_masked.float())
        advantaged_tokens = per_run_sum((loss_mask & (advantages != 0)).float())
        masked_fraction = masked_tokens / seen
        mean_ratio = per_run_sum(torch.where(loss_mask, ratio, 0.0)) / seen
    return RLLossOutput(
        loss=run_loss.sum(),
        run_loss=run_loss.detach(),
        masked_fraction=masked_fraction,
        mean_ratio=mean_ratio,
        loss_tokens=micro_loss_tokens.long(),
        masked_tokens=masked_tokens.long(),
        advantaged_tokens=advantaged_tokens.long(),
    )


def _per_run_settings(
    loss_config: LossConfig | Sequence[LossConfig | None] | None, n_runs: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if loss_config is None or isinstance(loss_config, LossConfig):
        configs = [loss_config or LossConfig()] * n_runs
    else:
        if len(loss_config) != n_runs:
            raise ValueError(f"need one LossConfig per slot ({n_runs}), got {len(loss_config)}")
        configs = [config or LossConfig() for config in loss_config]

    def column(values: list, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return to_device(torch.tensor(values, dtype=dtype), device)

    return (
        column([c.mask_ratio_low for c in configs]),
        column([c.mask_ratio_high for c in configs]),
        column([c.kl_coef for c in configs]),
        column([c.mask_both_sides for c in configs], torch.bool),
    )


# ---------------------------------------------------------------------------- log-probs


def compute_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """log p(input_ids[t] | tokens before t) in float32, aligned with `input_ids`.

    `logits` [B, T, V] (or [T, V]) are the model's outputs for `input_ids` [B, T] (or [T]);
    the value at position 0 (no prediction for it) is 0, as is, in a packed row, the value
    at the first token of each sample (it is predicted from the previous sample); keep
    those out of the loss mask (they are prompt tokens). Computed `chunk_size` positions
    at a time, forward and backward, so at most one chunk of float32 vocabulary-wide
    values exists besides the logits and their gradient.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    squeeze = logits.ndim == 2
    if squeeze:
        logits, input_ids = logits.unsqueeze(0), input_ids.unsqueeze(0)
    batch, seq_len, vocab = logits.shape
    if tuple(input_ids.shape) != (batch, seq_len):
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} do not match logits {tuple(logits.shape)}"
        )
    # Position t predicts token t + 1; the last position predicts nothing we have, so its
    # target is a dummy 0 and its result is shifted out below.
    targets = torch.cat([input_ids[:, 1:], input_ids.new_zeros(batch, 1)], dim=1)
    next_token_logprobs = _SelectedLogSoftmax.apply(
        logits.reshape(batch * seq_len, vocab), targets.reshape(-1), temperature, chunk_size
    ).view(batch, seq_len)
    result = torch.cat(
        [next_token_logprobs.new_zeros(batch, 1), next_token_logprobs[:, :-1]], dim=1
    )
    return result.squeeze(0) if squeeze else result


class _SelectedLogSoftmax(torch.autograd.Function):
    """log_softmax(logits / T)[target] per row, chunked; backward recomputes the softmax.

    Saves only the logits (alive anyway as the model's output) and one logsumexp per row,
    instead of autograd's float32 copy of the whole [rows, vocab] log-softmax.
    """

    @staticmethod
    def forward(ctx, logits, targets, temperature, chunk_size):  # type: ignore[override]
        out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        logsumexp = torch.empty_like(out)
        for start in range(0, logits.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            scaled = logits[rows].float() / temperature
            logsumexp[rows] = torch.logsumexp(scaled, dim=-1)
            out[rows] = scaled.gather(-1, targets[rows, None]).squeeze(-1) - logsumexp[rows]
        ctx.save_for_backward(logits, targets, logsumexp)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        logits, targets, logsumexp = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            grad = grad_out[rows, None].float()
            probs = torch.exp(logits[rows].float() / ctx.temperature - logsumexp[rows, None])
            chunk_grad = -probs * grad
            chunk_grad.scatter_add_(-1, targets[rows, None], grad)
            grad_logits[rows] = (chunk_grad / ctx.temperature).to(grad_logits.dtype)
        return grad_logits, None, None, None
