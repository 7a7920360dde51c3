"""Every loss kind and aggregation against its formula from its source (verl's
`core_algos.py`, the GSPO and CISPO papers, prime-rl's loss), written out here rather than by
calling the implementation: per-token loss and gradient on random log-probs, advantages and
masks, ratios that overflow included."""

from __future__ import annotations

import math

import pytest
import torch

from workbench.config import DefaultLoss, LossConfig, loss_config
from workbench.trainer.rl.loss import compute_rl_loss

TOKENS = 24


def random_batch(seed: int, overflow: bool = True):
    """Two completions (positions from 0 each) of one run: trainer log-probs wanting a
    gradient, sampler log-probs, advantages per completion and a loss mask with the
    prompt's tokens off. With `overflow`, one masked-off token has a ratio of e^200 (inf in
    float32) and one loss token e^30 (clamped to e^20 by the ratio kinds)."""
    generator = torch.Generator().manual_seed(seed)
    sampler = -torch.rand(TOKENS, generator=generator) * 3 - 0.1
    trainer = sampler + 0.4 * torch.randn(TOKENS, generator=generator)
    positions = torch.cat([torch.arange(10), torch.arange(14)])
    mask = torch.ones(TOKENS, dtype=torch.bool)
    mask[[0, 1, 2, 10, 11]] = False  # prompts
    mask[7] = False  # an environment token inside a completion
    advantages = torch.cat([torch.full((10,), 0.7), torch.full((14,), -1.3)])
    if overflow:
        trainer[7] = sampler[7] + 200.0  # off the mask: must not poison anything
        trainer[15] = sampler[15] + 30.0
    return trainer.requires_grad_(), sampler, advantages, mask, positions


def run(config: LossConfig, seed: int = 0, overflow: bool = True, **kwargs):
    trainer, sampler, advantages, mask, positions = random_batch(seed, overflow)
    out = compute_rl_loss(
        trainer,
        sampler,
        advantages,
        mask,
        torch.tensor([TOKENS]),
        config,
        position_ids=positions,
        **kwargs,
    )
    out.loss.backward()
    return out, trainer, sampler, advantages, mask, positions


def expected_loss_and_grad(per_token_fn, trainer, sampler, advantages, mask, positions, agg):
    """The formula's loss, aggregated as `agg` says, and its gradient by autograd on a fresh
    leaf: `per_token_fn(lp, lp_s, A)` gives the reference's per-token term for loss tokens
    (called on them only, so a masked-off token's overflow never enters)."""
    lp = trainer.detach().clone().requires_grad_()
    keep = mask.nonzero().squeeze(1)
    terms = per_token_fn(lp[keep], sampler[keep], advantages[keep], keep)
    sample_of = (torch.cumsum((positions == 0).long(), 0) - 1)[keep]
    if agg == "token_mean":
        loss = terms.sum() / len(keep)
    elif agg == "sequence_mean":
        loss = sum(terms[sample_of == i].mean() for i in range(2)) / 2
    else:
        loss = terms.sum() / agg
    loss.backward()
    return loss.detach(), lp.grad


def clamp20(x):
    return x.clamp(-20, 20)


def check(config, per_token_fn, agg="token_mean", **kwargs):
    out, trainer, sampler, advantages, mask, positions = run(config, **kwargs)
    loss, grad = expected_loss_and_grad(
        per_token_fn, trainer, sampler, advantages, mask, positions, agg
    )
    assert torch.isfinite(out.loss) and torch.isfinite(trainer.grad).all()
    torch.testing.assert_close(out.loss.detach(), loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(trainer.grad, grad, rtol=1e-5, atol=1e-7)
    assert trainer.grad[~mask].eq(0).all(), "a token off the loss mask got a gradient"
    return out


def test_ppo_is_the_max_of_the_unclipped_and_clipped_surrogates():
    def ppo(lp, lp_s, a, _):
        r = torch.exp(clamp20(lp - lp_s))
        return torch.maximum(-a * r, -a * r.clamp(1 - 0.2, 1 + 0.28))

    out = check(loss_config("ppo", eps_high=0.28), ppo)
    assert 0 < out.masked_fraction.item() < 1  # some tokens clipped, not all


def test_ppo_dual_clip_bounds_only_negative_advantages():
    def dual(lp, lp_s, a, _):
        r = torch.exp(clamp20(lp - lp_s))
        ppo = torch.maximum(-a * r, -a * r.clamp(0.8, 1.2))
        return torch.where(a < 0, torch.minimum(ppo, -a * 3.0), ppo)

    check(loss_config("ppo", dual_clip=3.0), dual)
    # The e^20-ratio token has A < 0: unbounded without dual-clip, bounded at 3 * |A| with it.
    plain, *_ = run(loss_config("ppo"))
    bounded, *_ = run(loss_config("ppo", dual_clip=3.0))
    assert plain.loss.item() > 1e6 and bounded.loss.item() < 10


def test_gspo_clips_the_sequence_level_ratio_and_averages_per_sequence():
    def gspo(lp, lp_s, a, keep):
        positions = random_batch(0)[4]
        sample_of = (torch.cumsum((positions == 0).long(), 0) - 1)[keep]
        log_r = clamp20(lp - lp_s)
        terms = []
        for i in range(2):
            own = sample_of == i
            log_s = log_r[own].detach().mean()  # s_i = exp(mean_t log r)
            s = torch.exp((lp[own] - lp[own].detach() + log_s).clamp(max=10))
            terms.append(torch.maximum(-a[own] * s, -a[own] * s.clamp(1 - 3e-4, 1 + 4e-4)))
        return torch.cat(terms)

    check(loss_config("gspo"), gspo, agg="sequence_mean", overflow=False)


def test_gspo_gives_every_token_of_a_sequence_the_same_ratio_gradient_weight():
    _out, trainer, _sampler, _advantages, mask, _positions = run(
        loss_config("gspo", eps_low=0.99, eps_high=100.0), overflow=False
    )
    first = mask & (torch.arange(TOKENS) < 10)  # the first completion's loss tokens
    weights = trainer.grad[first]
    assert torch.allclose(weights, weights[0].expand_as(weights))


def test_cispo_weights_every_tokens_log_prob_gradient_by_the_clipped_stopped_ratio():
    def cispo(lp, lp_s, a, _):
        w = torch.exp(clamp20(lp - lp_s)).clamp(0.0, 4.0).detach()
        return -w * a * lp

    out = check(loss_config("cispo"), cispo)
    assert out.masked_tokens.item() >= 1  # the e^20 token's weight was bounded
    # ... but it is not zeroed: it keeps gradient -4 * A / n, unlike PPO's clipped tokens.
    out, trainer, _, _, mask, _ = run(loss_config("cispo"))
    assert trainer.grad[15].item() == pytest.approx(-4.0 * -1.3 / int(mask.sum()), rel=1e-5)


def test_plain_importance_sampling_is_minus_ratio_times_advantage():
    check(loss_config("is"), lambda lp, lp_s, a, _: -torch.exp(clamp20(lp - lp_s)) * a)


def test_reinforce_is_minus_advantage_times_log_prob():
    check(loss_config("reinforce"), lambda lp, lp_s, a, _: -a * lp)


def test_default_kind_is_todays_masked_importance_sampling():
    def masked_is(lp, lp_s, a, _):
        log_r = lp - lp_s
        r = torch.exp(log_r.detach())
        drop = ((a > 0) & (r > 8.0)) | ((a < 0) & (r < 0.125)) | (log_r.detach().abs() > 20)
        kept = torch.where(drop, 0.0, log_r)
        return torch.where(drop, 0.0, -torch.exp(kept) * a + 1e-3 * kept.square() / 2)

    check(DefaultLoss(), masked_is)


@pytest.mark.parametrize("kind", ["ppo", "cispo", "is", "reinforce", "default"])
def test_sequence_mean_averages_each_completions_token_mean(kind):
    config = loss_config(kind, aggregation="sequence_mean")
    token_mean = loss_config(kind)
    # Per-token terms are those of token_mean; only the weights differ: 1/(n_i * 2).
    _out_tokens, trainer_t, _, _, mask, positions = run(token_mean)
    _out_seq, trainer_s, *_ = run(config)
    sample_of = torch.cumsum((positions == 0).long(), 0) - 1
    n_i = torch.stack([(mask & (sample_of == i)).sum() for i in range(2)]).float()
    n = mask.sum().float()
    expected = trainer_t.grad * n / (n_i[sample_of] * 2)
    torch.testing.assert_close(trainer_s.grad, expected, rtol=1e-5, atol=1e-7)


def test_constant_aggregation_divides_the_sum_by_the_normaliser_whatever_the_length():
    def reinforce(lp, lp_s, a, _):
        return -a * lp

    check(
        loss_config("reinforce", aggregation="constant", normaliser=512.0),
        reinforce,
        agg=512.0,
    )
    # Without loss.normaliser, the trainer's constant (batch_size * max_tokens) is used.
    check(
        loss_config("reinforce", aggregation="constant"),
        reinforce,
        agg=300.0,
        constant_normalisers=[300.0],
    )


@pytest.mark.parametrize(
    ("estimator", "formula"),
    [
        ("k1", lambda d: d),
        ("k2", lambda d: d.square() / 2),
        ("k3", lambda d: (torch.exp(-d.clamp(-20, 20)) + d.clamp(-20, 20) - 1).clamp(-10, 10)),
    ],
)
def test_kl_to_the_base_adds_coef_times_the_estimator_per_loss_token(estimator, formula):
    _trainer, sampler, _advantages, _mask, _positions = random_batch(3, overflow=False)
    base = sampler + 0.3 * torch.randn(TOKENS, generator=torch.Generator().manual_seed(9))

    def with_kl(lp, lp_s, a, keep):
        return -a * lp + 0.05 * formula(lp - base[keep])

    check(
        loss_config("reinforce", base_kl_coef=0.05, base_kl_estimator=estimator),
        with_kl,
        seed=3,
        overflow=False,
        base_logprobs=base,
    )


def test_ratio_diagnostics_are_the_mean_and_extremes_over_loss_tokens():
    out, trainer, sampler, _, mask, _ = run(loss_config("ppo"), overflow=False)
    ratios = torch.exp(trainer.detach() - sampler)[mask]
    assert out.ratio_sum.item() == pytest.approx(ratios.sum().item(), rel=1e-5)
    assert out.ratio_min.item() == pytest.approx(ratios.min().item(), rel=1e-6)
    assert out.ratio_max.item() == pytest.approx(ratios.max().item(), rel=1e-6)


def test_a_users_loss_given_by_import_path_is_called_with_its_args():
    config = loss_config(
        "tests.trainer.custom_loss:scaled_reinforce", args={"scale": 2.0, "cap": 1.5}
    )

    def scaled(lp, lp_s, a, _):
        w = torch.exp(clamp20(lp - lp_s)).clamp(max=1.5).detach()
        return -2.0 * w * a * lp

    check(config, scaled)


def test_a_users_loss_that_returns_the_wrong_shape_is_named(monkeypatch):
    import tests.trainer.custom_loss as module
    from workbench.trainer.losses import TokenLoss

    monkeypatch.setattr(module, "scaled_reinforce", lambda inputs: TokenLoss(torch.zeros(3)))
    with pytest.raises(ValueError, match=r"custom_loss:scaled_reinforce.*one value per token"):
        run(loss_config("tests.trainer.custom_loss:scaled_reinforce"))


def test_each_kind_reads_only_its_own_runs_tokens():
    """Two runs in one row, each with its own kind and aggregation: each run's loss and
    gradient are those it gets alone."""
    trainer, sampler, advantages, mask, positions = random_batch(5)
    configs = [loss_config("gspo"), loss_config("cispo", aggregation="constant")]
    counts = torch.tensor([10, 14])
    together = compute_rl_loss(
        trainer,
        sampler,
        advantages,
        mask,
        counts,
        configs,
        position_ids=positions,
        constant_normalisers=[None, 100.0],
    )
    together.loss.backward()
    for idx, part in enumerate([slice(0, 10), slice(10, 24)]):
        leaf = trainer.detach()[part].clone().requires_grad_()
        alone = compute_rl_loss(
            leaf,
            sampler[part],
            advantages[part],
            mask[part],
            torch.tensor([part.stop - part.start]),
            configs[idx],
            position_ids=positions[part],
            constant_normalisers=[100.0],
        )
        alone.loss.backward()
        assert together.run_loss[idx].item() == pytest.approx(alone.loss.item(), rel=1e-6)
        torch.testing.assert_close(trainer.grad[part], leaf.grad)
    assert math.isfinite(together.loss.item())


def test_gspo_caps_a_sequence_ratio_that_overflows_float32():
    """A completion every token of which the trainer finds e^200 likelier than the sampler
    did (exp overflows to inf in float32): each token's log-ratio is clamped to 20, the
    sequence's to 10 (verl's cap), so its ratio is e^10, its loss finite and its gradient 0
    (the cap stops it, as verl's does); the other completion is untouched by it."""
    trainer, sampler, advantages, mask, positions = random_batch(0, overflow=False)
    with torch.no_grad():
        trainer[10:] = sampler[10:] + 200.0  # the second completion (A = -1.3)
        assert torch.isinf(torch.exp(trainer[10:] - sampler[10:])).all()

    def gspo(lp, lp_s, a, keep):
        sample_of = (torch.cumsum((positions == 0).long(), 0) - 1)[keep]
        log_r = clamp20(lp - lp_s)
        terms = []
        for i in range(2):
            own = sample_of == i
            log_s = log_r[own].detach().mean()
            s = torch.exp((lp[own] - lp[own].detach() + log_s).clamp(max=10))
            terms.append(torch.maximum(-a[own] * s, -a[own] * s.clamp(1 - 3e-4, 1 + 4e-4)))
        return torch.cat(terms)

    out = compute_rl_loss(
        trainer,
        sampler,
        advantages,
        mask,
        torch.tensor([TOKENS]),
        loss_config("gspo"),
        position_ids=positions,
    )
    out.loss.backward()
    loss, grad = expected_loss_and_grad(
        gspo, trainer, sampler, advantages, mask, positions, "sequence_mean"
    )
    assert torch.isfinite(out.loss) and torch.isfinite(trainer.grad).all()
    torch.testing.assert_close(out.loss.detach(), loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(trainer.grad, grad, rtol=1e-5, atol=1e-7)
    # The capped completion: each loss token's term is 1.3 * e^10, and none gets a gradient.
    capped = trainer.detach()[10:][mask[10:]]
    assert out.run_loss.item() >= 1.3 * math.exp(10) / 2 - 10 and capped.numel() > 0
    assert trainer.grad[10:].eq(0).all()


@pytest.mark.parametrize(
    "config",
    [
        loss_config("reinforce", aggregation="sequence_mean"),
        loss_config("gspo"),  # sequence_mean by verl's rule
        loss_config("ppo", aggregation="constant", normaliser=50.0),
        loss_config("cispo", aggregation="constant"),
        loss_config("default"),
    ],
    ids=lambda config: f"{config.kind}-{config.aggregation}",
)
def test_a_runs_batch_split_over_micro_batches_is_normalised_as_in_one(config):
    """The trainer packs a run's batch into several micro-batches when it does not fit one
    row, backward each and sums the gradients: with the step's counts (`loss_tokens_per_run`,
    `samples_per_run`) each part's loss must be its share of the one-row loss, so the sum
    is that loss, and its gradient that gradient, for every aggregation."""
    trainer, sampler, advantages, mask, positions = random_batch(1)
    step_tokens = mask.sum().view(1)
    step_samples = torch.tensor([2])

    def loss_of(part: slice, leaf: torch.Tensor, **counts):
        return compute_rl_loss(
            leaf,
            sampler[part],
            advantages[part],
            mask[part],
            torch.tensor([part.stop - part.start]),
            config,
            position_ids=positions[part],
            constant_normalisers=[300.0],
            **counts,
        )

    whole = loss_of(slice(0, TOKENS), trainer)
    whole.loss.backward()
    total, parts = 0.0, []
    for part in (slice(0, 10), slice(10, TOKENS)):  # one completion each
        leaf = trainer.detach()[part].clone().requires_grad_()
        out = loss_of(part, leaf, loss_tokens_per_run=step_tokens, samples_per_run=step_samples)
        out.loss.backward()
        total += out.loss.item()
        parts.append(leaf.grad)
    assert total == pytest.approx(whole.loss.item(), rel=1e-5)
    torch.testing.assert_close(torch.cat(parts), trainer.grad, rtol=1e-5, atol=1e-7)
