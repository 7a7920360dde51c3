"""What one update tells about each run: the per-run tally of its rows and the `StepStats`
made from it.

The tally is summed (its extremes maximised) on the trainer's device and read once per
update, after the ranks have summed theirs: a read per row would wait for each row's
backward before the next row could be queued.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.config import LossConfig
from workbench.trainer.parallel import distributed
from workbench.trainer.rl.loss import RLLossOutput

# The rows of the per-run tally (sums over the update's rows and ranks).
LOSS, MASKED, TOKENS, ADVANTAGED, RATIO_SUM, BASE_KL = range(6)


@dataclass
class StepStats:
    """Per-run results of one update, for metrics lines."""

    loss: dict[int, float]
    grad_norm: dict[int, float]
    lr: dict[int, float]
    masked: dict[int, float]  # the share of the run's loss tokens where its trust region acted
    # Its gradient was exactly 0 although some of its tokens had an advantage (`divergence`).
    stalled: dict[int, bool]
    # Per run: the importance ratio's mean, least and largest over its loss tokens, and the
    # mean KL estimate to the base model (runs with that term only).
    ratio_mean: dict[int, float] = field(default_factory=dict)
    ratio_min: dict[int, float] = field(default_factory=dict)
    ratio_max: dict[int, float] = field(default_factory=dict)
    base_kl: dict[int, float] = field(default_factory=dict)


class StepTally:
    """Per slot: loss, masked, loss and advantaged tokens, ratio and KL sums, and the
    ratio's extremes (-min, max), over one update's rows."""

    def __init__(self, max_runs: int, device: torch.device) -> None:
        self.sums = torch.zeros(6, max_runs, dtype=torch.float64, device=device)
        self.extremes = torch.full((2, max_runs), -torch.inf, dtype=torch.float64, device=device)

    def add(self, out: RLLossOutput) -> None:
        sums, extremes = self.sums, self.extremes
        sums[LOSS] += out.run_loss.detach().double()
        sums[MASKED] += out.masked_tokens.double()
        sums[TOKENS] += out.loss_tokens.double()
        sums[ADVANTAGED] += out.advantaged_tokens.double()
        sums[RATIO_SUM] += out.ratio_sum.double()
        sums[BASE_KL] += out.base_kl_sum.double()
        torch.maximum(extremes[0], -out.ratio_min.double(), out=extremes[0])
        torch.maximum(extremes[1], out.ratio_max.double(), out=extremes[1])

    def reduce_over_ranks(self, device: torch.device) -> None:
        """Sum (maximise) every rank's tally into every rank's, on the host."""
        self.sums = distributed.all_reduce_sum(self.sums.cpu(), device)
        self.extremes = distributed.all_reduce_max(self.extremes.cpu(), device)

    def step_stats(
        self,
        ready: list[int],
        norms: dict[int, float],
        lrs: dict[int, float],
        loss_configs: list[LossConfig | None],
    ) -> StepStats:
        """The updated runs' results (`norms`: their gradient norms before clipping)."""
        sums, extremes = self.sums, self.extremes
        tokens = sums[TOKENS]
        return StepStats(
            loss={idx: float(sums[LOSS, idx]) for idx in ready},
            grad_norm={idx: float(norms.get(idx, float("nan"))) for idx in ready},
            lr={idx: lrs[idx] for idx in ready},
            masked={idx: float(sums[MASKED, idx] / tokens[idx].clamp_min(1)) for idx in ready},
            stalled={
                idx: norms.get(idx) == 0.0 and bool(sums[ADVANTAGED, idx] > 0) for idx in ready
            },
            ratio_mean={idx: float(sums[RATIO_SUM, idx] / tokens[idx]) for idx in ready},
            ratio_min={idx: float(-extremes[0, idx]) for idx in ready},
            ratio_max={idx: float(extremes[1, idx]) for idx in ready},
            base_kl={
                idx: float(sums[BASE_KL, idx] / tokens[idx])
                for idx in ready
                if loss_configs[idx].base_kl_coef > 0
            },
        )
