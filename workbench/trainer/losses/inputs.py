"""What a policy loss is given (one run's tokens of one micro-batch) and what it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.config import LossConfig

# exp(20) is 4.9e8, finite in float32; verl clamps log-ratios to +-20 before exp, as here.
MAX_ABS_LOG_RATIO = 20.0


@dataclass
class LossInputs:
    """One run's tokens of one packed micro-batch, all [T] float32 (`loss_mask` bool,
    `sample_index` int64) on the trainer's device.

    `logprobs` carries the gradient; `sampler_logprobs` are vLLM's (the "old" policy: in
    async RL the trust region is taken against the sampler, as prime-rl and Tinker do).
    `sample_index[t]` numbers the completions of this slice 0..num_samples-1; a completion
    is never split across micro-batches. `args` is `loss.args` (import-path kinds)."""

    logprobs: torch.Tensor
    sampler_logprobs: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    sample_index: torch.Tensor
    num_samples: int
    config: LossConfig
    args: dict[str, Any] = field(default_factory=dict)

    def log_ratio(self) -> torch.Tensor:
        """log(pi / pi_sampler) on loss tokens, 0 elsewhere, clamped to +-20.

        Taken with `where`, not by multiplying with the mask: a token off the mask may have
        an infinite difference, and 0 * inf is nan in the forward and in the backward."""
        difference = torch.where(self.loss_mask, self.logprobs - self.sampler_logprobs, 0.0)
        return difference.clamp(-MAX_ABS_LOG_RATIO, MAX_ABS_LOG_RATIO)

    def per_sample_sum(self, values: torch.Tensor) -> torch.Tensor:
        """[num_samples]: the sum of `values` over each completion's tokens."""
        return values.new_zeros(self.num_samples).index_add(0, self.sample_index, values)

    def sample_loss_tokens(self) -> torch.Tensor:
        """[num_samples]: each completion's number of loss tokens (float)."""
        return self.per_sample_sum(self.loss_mask.float())


@dataclass
class TokenLoss:
    """`loss` [T]: each token's term to minimise (anything off the loss mask is ignored).
    `clipped` [T] bool: tokens where the loss's trust region acted (masked, clipped or its
    weight bounded), for the run's `clipped` metric; None: the loss has none."""

    loss: torch.Tensor
    clipped: torch.Tensor | None = None
