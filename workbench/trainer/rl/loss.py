"""The RL loss over a packed multi-run micro-batch.

Each run's tokens go to its own policy loss (`loss.kind`, `workbench.trainer.losses`),
which gives each token's term; a KL term to the base model is added for runs that ask
(`loss.base_kl_coef`); then each run's terms are aggregated by its own `loss.aggregation`:

- `token_mean` (the default, prime-rl's and DAPO's): the sum over the run's loss tokens
  divided by its number of loss tokens over the whole step;
- `sequence_mean` (GRPO's, and verl's for GSPO): each completion's token mean, summed,
  divided by the run's number of completions in the step;
- `constant` (Dr. GRPO): the sum divided by a constant (`loss.normaliser`, or the run's
  batch_size * max_tokens, TRL's choice).

The default kind is prime-rl's masked importance sampling (`losses/builtin.py`):

    loss_t = -r_t * A_t + kl_coef * (logp_t - old_logp_t)^2 / 2   on kept tokens

Run isolation: a run's loss reads only its own tokens and its own counts, and the total is
the plain sum over runs, so no run's settings, token count or loss scale changes another
run's gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from workbench.config import DefaultLoss, LossConfig, UserLoss
from workbench.trainer.losses import LossInputs, loss_function
from workbench.trainer.losses.kl import kl_estimate
from workbench.trainer.transfer import to_device


@dataclass
class RLLossOutput:
    """`loss` is what to backward; the per-run tensors (one entry per slot) are for logging
    and cover this micro-batch."""

    loss: torch.Tensor
    run_loss: torch.Tensor
    masked_fraction: torch.Tensor
    mean_ratio: torch.Tensor
    loss_tokens: torch.Tensor
    # Loss tokens where the run's trust region acted: masked (default), clipped (ppo, gspo),
    # weight bounded (cispo).
    masked_tokens: torch.Tensor
    # Loss tokens whose advantage is not 0: the ones that can move the adapter.
    advantaged_tokens: torch.Tensor
    # Sums over loss tokens of the importance ratio (trainer / sampler) and of the KL
    # estimate to the base model (0 for a run without that term); the ratio's extremes.
    ratio_sum: torch.Tensor | None = None
    ratio_min: torch.Tensor | None = None
    ratio_max: torch.Tensor | None = None
    base_kl_sum: torch.Tensor | None = None


def compute_rl_loss(
    trainer_logprobs: torch.Tensor,
    inference_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    lora_num_tokens: torch.Tensor,
    loss_config: LossConfig | Sequence[LossConfig | None] | None = None,
    loss_tokens_per_run: torch.Tensor | None = None,
    *,
    position_ids: torch.Tensor | None = None,
    samples_per_run: torch.Tensor | None = None,
    constant_normalisers: Sequence[float | None] | None = None,
    base_logprobs: torch.Tensor | None = None,
) -> RLLossOutput:
    """Loss of one packed micro-batch whose tokens are contiguous per run, in slot order.

    Per-token inputs may be [T] or [1, T]. `loss_config` is one config for every run or one
    per slot (None for a free slot). `loss_tokens_per_run` is each run's loss-token count
    over the whole step; pass it when a run's batch spans several micro-batches (or ranks
    whose gradients are summed) so every token of the run has the same weight; likewise
    `samples_per_run`, each run's completions in the step, for `sequence_mean`. Without
    them this micro-batch's counts are used. `position_ids` (from 0 at each completion)
    tell completions apart, which sequence-level kinds and aggregation need;
    `constant_normalisers` (per slot) stand in for an unset `loss.normaliser`;
    `base_logprobs` are the base model's, for runs with `loss.base_kl_coef` > 0.
    """
    row = _PackedRow.flatten(
        trainer_logprobs,
        inference_logprobs,
        advantages,
        loss_mask,
        lora_num_tokens,
        position_ids,
        base_logprobs,
    )
    configs = _per_run_configs(loss_config, row.n_runs)
    terms, clipped, base_kl = _per_run_token_terms(row, configs)
    micro_loss_tokens = row.per_run_sum(row.loss_mask.float())
    if samples_per_run is None:
        samples_per_run = _micro_samples(
            row.host_index, row.sample_index, row.run_of_token, row.loss_mask, row.n_runs
        )
    denominators = _denominators(
        configs,
        micro_loss_tokens if loss_tokens_per_run is None else loss_tokens_per_run,
        samples_per_run,
        constant_normalisers,
        row.device,
    )
    run_loss = row.per_run_sum(terms) / denominators
    return _loss_output(row, run_loss, micro_loss_tokens, clipped, base_kl)


@dataclass
class _PackedRow:
    """One micro-batch's per-token inputs, flat and on the logits' device, with where each
    run's tokens lie (`counts`, on the host) and, with position ids, which completion each
    token belongs to (`host_index` on the host, `sample_index` on the device)."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    base_logprobs: torch.Tensor | None
    counts: torch.Tensor
    run_of_token: torch.Tensor
    host_index: torch.Tensor | None
    sample_index: torch.Tensor | None

    @property
    def device(self) -> torch.device:
        return self.logprobs.device

    @property
    def n_runs(self) -> int:
        return self.counts.numel()

    def per_run_sum(self, values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(self.n_runs).index_add(0, self.run_of_token, values)

    @classmethod
    def flatten(
        cls,
        trainer_logprobs: torch.Tensor,
        inference_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        loss_mask: torch.Tensor,
        lora_num_tokens: torch.Tensor,
        position_ids: torch.Tensor | None,
        base_logprobs: torch.Tensor | None,
    ) -> _PackedRow:
        logprobs = trainer_logprobs.reshape(-1).float()
        device = logprobs.device
        old_logprobs = to_device(inference_logprobs.reshape(-1).float(), device)
        advantages = to_device(advantages.reshape(-1).float(), device)
        loss_mask = to_device(loss_mask.reshape(-1).bool(), device)
        # The counts are read on the host (as the packer made them): expanding counts that
        # live on a GPU would wait for them, a sync per micro-batch.
        counts = torch.as_tensor(lora_num_tokens, dtype=torch.long).cpu()
        sizes = (logprobs.numel(), old_logprobs.numel(), advantages.numel(), loss_mask.numel())
        if len(set(sizes)) != 1:
            raise ValueError(
                "trainer_logprobs, inference_logprobs, advantages and loss_mask need one value "
                "per token; got {}, {}, {}, {}".format(*sizes)
            )
        total = int(counts.sum())
        if total != logprobs.numel():
            raise ValueError(
                f"lora_num_tokens sums to {total} but there are {logprobs.numel()} tokens"
            )
        run_of_token = torch.repeat_interleave(
            torch.arange(counts.numel(), device=device),
            to_device(counts, device),
            output_size=total,
        )
        # Completions are told apart on the host, where the packer's position ids are:
        # reading a device tensor's values would be a host sync per run.
        host_index = _sample_index(position_ids, counts)
        return cls(
            logprobs=logprobs,
            old_logprobs=old_logprobs,
            advantages=advantages,
            loss_mask=loss_mask,
            base_logprobs=None
            if base_logprobs is None
            else to_device(base_logprobs.reshape(-1).float(), device),
            counts=counts,
            run_of_token=run_of_token,
            host_index=host_index,
            sample_index=None if host_index is None else to_device(host_index, device),
        )


def _per_run_token_terms(
    row: _PackedRow, configs: list[LossConfig]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every token's loss term, trust-region flag and base-KL estimate, each run's tokens
    by that run's own loss settings."""
    terms, clipped, base_kl = [], [], []
    start = 0
    for idx, length in enumerate(row.counts.tolist()):
        run = slice(start, start + length)
        start += length
        if not length:
            continue
        config = configs[idx]
        first, last = (
            (0, 0)
            if row.host_index is None
            else (int(row.host_index[run.start]), int(row.host_index[run.stop - 1]))
        )
        inputs = LossInputs(
            logprobs=row.logprobs[run],
            sampler_logprobs=row.old_logprobs[run],
            advantages=row.advantages[run],
            loss_mask=row.loss_mask[run],
            sample_index=_local_index(row.sample_index, run, first, config, row.device),
            num_samples=last - first + 1,
            config=config,
            args=config.args if isinstance(config, UserLoss) else {},
        )
        run_base = None if row.base_logprobs is None else row.base_logprobs[run]
        term, run_clipped, kl = _run_terms(inputs, run_base, idx)
        terms.append(term)
        clipped.append(run_clipped)
        base_kl.append(kl)
    return torch.cat(terms), torch.cat(clipped), torch.cat(base_kl)


def _loss_output(
    row: _PackedRow,
    run_loss: torch.Tensor,
    micro_loss_tokens: torch.Tensor,
    clipped: torch.Tensor,
    base_kl: torch.Tensor,
) -> RLLossOutput:
    """The loss to backward and, detached, each run's statistics of this micro-batch."""
    loss_mask = row.loss_mask
    with torch.no_grad():
        seen = micro_loss_tokens.clamp_min(1.0)
        masked_tokens = row.per_run_sum(clipped.float())
        advantaged_tokens = row.per_run_sum((loss_mask & (row.advantages != 0)).float())
        ratio = torch.exp(torch.where(loss_mask, row.logprobs - row.old_logprobs, 0.0))
        ratio_sum = row.per_run_sum(torch.where(loss_mask, ratio, 0.0))
        inf = torch.full((row.n_runs,), torch.inf, device=row.device)
        ratio_min = inf.scatter_reduce(
            0, row.run_of_token, torch.where(loss_mask, ratio, torch.inf), "amin"
        )
        ratio_max = (-inf).scatter_reduce(
            0, row.run_of_token, torch.where(loss_mask, ratio, -torch.inf), "amax"
        )
    return RLLossOutput(
        loss=run_loss.sum(),
        run_loss=run_loss.detach(),
        masked_fraction=masked_tokens / seen,
        mean_ratio=ratio_sum / seen,
        loss_tokens=micro_loss_tokens.long(),
        masked_tokens=masked_tokens.long(),
        advantaged_tokens=advantaged_tokens.long(),
        ratio_sum=ratio_sum,
        ratio_min=ratio_min,
        ratio_max=ratio_max,
        base_kl_sum=row.per_run_sum(base_kl),
    )


def _run_terms(
    inputs: LossInputs, base_logprobs: torch.Tensor | None, idx: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One run's token terms as its aggregation sums them (a `sequence_mean` run's divided
    by their completion's loss tokens), with its KL term to the base; where its trust
    region acted; its KL estimates (0 without that term), detached."""
    config = inputs.config
    term, clipped = _policy_terms(inputs)
    per_sequence = config.aggregation == "sequence_mean"
    if per_sequence:
        lengths = inputs.sample_loss_tokens().clamp_min(1.0)[inputs.sample_index]
        term = term / lengths
    if config.base_kl_coef <= 0:
        return term, clipped, term.new_zeros(term.shape).detach()
    if base_logprobs is None:
        raise ValueError(f"slot {idx} asks for a KL term to the base: pass base_logprobs")
    estimate = kl_estimate(inputs.logprobs, base_logprobs, config.base_kl_estimator)
    kl = torch.where(inputs.loss_mask, estimate, 0.0)
    weighted = config.base_kl_coef * kl
    return term + (weighted / lengths if per_sequence else weighted), clipped, kl.detach()


def _policy_terms(inputs: LossInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's loss kind on its tokens: each loss token's term (0 elsewhere) and where
    its trust region acted."""
    kind = inputs.config.kind
    result = loss_function(kind)(inputs)
    shape = tuple(inputs.logprobs.shape)
    if tuple(getattr(result, "loss", torch.empty(0)).shape) != shape:
        raise ValueError(
            f"loss.kind {kind!r} must return a TokenLoss whose loss has one value per token "
            f"{shape}; got {result!r:.200}"
        )
    clipped = result.clipped if result.clipped is not None else torch.zeros_like(inputs.loss_mask)
    return torch.where(inputs.loss_mask, result.loss, 0.0), clipped.bool() & inputs.loss_mask


def _per_run_configs(
    loss_config: LossConfig | Sequence[LossConfig | None] | None, n_runs: int
) -> list[LossConfig]:
    if loss_config is None or isinstance(loss_config, LossConfig):
        return [loss_config or DefaultLoss()] * n_runs
    if len(loss_config) != n_runs:
        raise ValueError(f"need one LossConfig per slot ({n_runs}), got {len(loss_config)}")
    return [config or DefaultLoss() for config in loss_config]


# Kinds and aggregations that need to tell a run's completions apart.
SEQUENCE_KINDS = ("gspo",)


def _sample_index(position_ids: torch.Tensor | None, counts: torch.Tensor) -> torch.Tensor | None:
    """On the host, the completion number of every token in the row: a completion starts
    where the position does not go on from the previous token's (as attention reads it: a
    shared prompt's branch goes on from its branch point, not from the previous
    completion's end), and at every run's first token."""
    if position_ids is None:
        return None
    positions = position_ids.reshape(-1).long().cpu()
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[1:] = positions[1:] != positions[:-1] + 1
    run_starts = torch.cumsum(counts, 0)[:-1]
    starts[run_starts[run_starts < positions.numel()]] = True
    return torch.cumsum(starts.long(), 0) - 1


def _local_index(
    sample_index: torch.Tensor | None,
    run: slice,
    first: int,
    config: LossConfig,
    device: torch.device,
) -> torch.Tensor:
    """The run's completions numbered from 0 (`first`: its first one's number in the row);
    without position ids, all of its tokens as one completion, which only a loss that does
    not look at completions may use."""
    if sample_index is None:
        if config.kind in SEQUENCE_KINDS or config.aggregation == "sequence_mean":
            raise ValueError(
                f"loss.kind {config.kind!r} with aggregation "
                f"{config.aggregation!r} needs position_ids to tell completions apart"
            )
        return torch.zeros(run.stop - run.start, dtype=torch.long, device=device)
    return sample_index[run] - first


def _micro_samples(
    host_index: torch.Tensor | None,
    sample_index: torch.Tensor | None,
    run_of_token: torch.Tensor,
    loss_mask: torch.Tensor,
    n_runs: int,
) -> torch.Tensor:
    """Completions with a loss token, per run, in this micro-batch (without the step's
    counts: a caller whose runs each fit one micro-batch)."""
    if host_index is None or sample_index is None:
        return torch.zeros(n_runs, device=loss_mask.device)
    n_samples = int(host_index[-1]) + 1
    has_loss = torch.zeros(n_samples, device=loss_mask.device)
    has_loss[sample_index[loss_mask]] = 1.0
    run_of_sample = torch.zeros(n_samples, dtype=torch.long, device=loss_mask.device)
    run_of_sample[sample_index] = run_of_token
    return has_loss.new_zeros(n_runs).index_add(0, run_of_sample, has_loss)


def _denominators(
    configs: list[LossConfig],
    loss_tokens: torch.Tensor,
    samples: torch.Tensor,
    constant_normalisers: Sequence[float | None] | None,
    device: torch.device,
) -> torch.Tensor:
    """Per run, what its summed terms are divided by, as its aggregation says."""
    tokens = to_device(torch.as_tensor(loss_tokens).float(), device).clamp_min(1.0)
    if all(config.aggregation == "token_mean" for config in configs):
        return tokens
    samples = to_device(torch.as_tensor(samples).float(), device).clamp_min(1.0)
    values = []
    for idx, config in enumerate(configs):
        aggregation = config.aggregation
        if aggregation == "token_mean":
            values.append(tokens[idx])
        elif aggregation == "sequence_mean":
            values.append(samples[idx])
        else:
            constant = config.normaliser
            if constant is None and constant_normalisers is not None:
                constant = constant_normalisers[idx]
            if constant is None:
                raise ValueError(
                    f"slot {idx}: aggregation 'constant' needs loss.normaliser or the "
                    "trainer's constant_normalisers"
                )
            values.append(tokens.new_tensor(float(constant)))
    return torch.stack(values)
