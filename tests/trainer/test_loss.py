"""The RL loss: ratio masking, the KL-style penalty, per-run normalisation; token log-probs."""

from __future__ import annotations

import math

import pytest
import torch

from workbench.config import DefaultLoss
from workbench.trainer.compute.lm_head import compute_logprobs
from workbench.trainer.rl.loss import compute_rl_loss

NO_KL = DefaultLoss(kl_coef=0.0)


def logprobs_with_ratios(ratios: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Trainer log-probs (a leaf that wants a gradient) and inference log-probs with the
    given importance ratios."""
    old = torch.linspace(-3.0, -0.5, len(ratios))
    new = (old + torch.log(torch.tensor(ratios))).requires_grad_()
    return new, old


def test_loss_is_minus_ratio_times_advantage_plus_half_squared_log_ratio_per_loss_token():
    ratios = [1.0, 2.0, 0.5]
    advantages = torch.tensor([1.0, -2.0, 0.5])
    new, old = logprobs_with_ratios(ratios)
    config = DefaultLoss(kl_coef=0.1)

    result = compute_rl_loss(new, old, advantages, torch.ones(3), torch.tensor([3]), config)

    expected = sum(
        -r * a + 0.1 * math.log(r) ** 2 / 2
        for r, a in zip(ratios, advantages.tolist(), strict=True)
    ) / len(ratios)
    assert result.loss.item() == pytest.approx(expected, rel=1e-6)
    result.loss.backward()
    # d/dlogp of -r A + c (log r)^2 / 2 is -r A + c log r.
    expected_grad = [
        (-r * a + 0.1 * math.log(r)) / 3 for r, a in zip(ratios, advantages.tolist(), strict=True)
    ]
    assert new.grad.tolist() == pytest.approx(expected_grad, rel=1e-5)
    assert result.mean_ratio.item() == pytest.approx(sum(ratios) / 3, rel=1e-6)


def test_tokens_whose_ratio_left_the_band_are_masked_and_get_no_gradient():
    # Band [0.125, 8]: 0.1 and 9 fall outside, 0.13 and 7.9 stay inside.
    new, old = logprobs_with_ratios([1.0, 0.1, 9.0, 0.13, 7.9])
    both = DefaultLoss(kl_coef=0.0, mask_both_sides=True)
    result = compute_rl_loss(new, old, torch.ones(5), torch.ones(5), torch.tensor([5]), both)
    result.loss.backward()

    assert new.grad[1] == 0 and new.grad[2] == 0
    assert new.grad[[0, 3, 4]].tolist() == pytest.approx([-1.0 / 5, -0.13 / 5, -7.9 / 5], rel=1e-5)
    assert result.masked_fraction.item() == pytest.approx(2 / 5)
    # Masked tokens still count in the denominator: masking one does not reweight the rest.
    assert result.loss_tokens.tolist() == [5]


def test_only_tokens_that_moved_too_far_in_their_advantages_direction_are_masked():
    # ratio 9 with A > 0 and 0.1 with A < 0 moved too far the way the update pushes them;
    # 9 with A < 0 and 0.1 with A > 0 moved against it and keep their gradient.
    new, old = logprobs_with_ratios([9.0, 0.1, 9.0, 0.1])
    advantages = torch.tensor([1.0, -1.0, -1.0, 1.0])
    result = compute_rl_loss(new, old, advantages, torch.ones(4), torch.tensor([4]), NO_KL)
    result.loss.backward()
    assert new.grad[0] == 0 and new.grad[1] == 0
    assert new.grad[2].item() == pytest.approx(9.0 / 4, rel=1e-5)
    assert new.grad[3].item() == pytest.approx(-0.1 / 4, rel=1e-5)
    assert result.masked_fraction.item() == pytest.approx(2 / 4)


def test_a_ratio_that_overflows_float32_is_masked_without_poisoning_the_gradient():
    new, old = logprobs_with_ratios([1.0, 1.0])
    with torch.no_grad():
        new[1] += 200.0  # exp(200) is inf in float32
    result = compute_rl_loss(new, old, torch.ones(2), torch.ones(2), torch.tensor([2]))
    result.loss.backward()
    assert torch.isfinite(result.loss) and torch.isfinite(new.grad).all()
    assert new.grad[1] == 0


def test_tokens_outside_the_loss_mask_count_for_nothing():
    new, old = logprobs_with_ratios([1.0, 3.0, 1.5, 0.5])
    loss_mask = torch.tensor([False, True, True, False])
    result = compute_rl_loss(new, old, torch.ones(4), loss_mask, torch.tensor([4]), NO_KL)
    result.loss.backward()
    assert new.grad[0] == 0 and new.grad[3] == 0
    assert result.loss.item() == pytest.approx(-(3.0 + 1.5) / 2, rel=1e-6)
    assert result.loss_tokens.tolist() == [2]


def test_duplicating_run_bs_tokens_does_not_change_run_as_loss_or_gradient():
    generator = torch.Generator().manual_seed(0)
    a_new, a_old = -torch.rand(6, generator=generator), -torch.rand(6, generator=generator)
    b_new, b_old = -torch.rand(4, generator=generator), -torch.rand(4, generator=generator)
    a_adv, b_adv = torch.randn(6, generator=generator), 1000 * torch.randn(4, generator=generator)

    def run_a_loss_and_grad(b_copies: int):
        a_logprobs = a_new.clone().requires_grad_()
        result = compute_rl_loss(
            torch.cat([a_logprobs, *[b_new] * b_copies]),
            torch.cat([a_old, *[b_old] * b_copies]),
            torch.cat([a_adv, *[b_adv] * b_copies]),
            torch.ones(6 + 4 * b_copies),
            torch.tensor([6, 0, 4 * b_copies]),
        )
        result.loss.backward()
        return result, a_logprobs.grad

    once, a_grad_once = run_a_loss_and_grad(1)
    twice, a_grad_twice = run_a_loss_and_grad(2)
    torch.testing.assert_close(a_grad_twice, a_grad_once, rtol=0, atol=0)
    assert twice.run_loss[0] == once.run_loss[0]
    assert twice.run_loss[2].item() == pytest.approx(once.run_loss[2].item(), rel=1e-6)
    assert once.loss.item() == pytest.approx(once.run_loss.sum().item(), rel=1e-6)
    assert once.loss_tokens.tolist() == [6, 0, 4]


def test_each_run_masks_with_its_own_thresholds_and_penalty():
    new, old = logprobs_with_ratios([3.0, 3.0])
    strict = DefaultLoss(mask_ratio_high=2.0, kl_coef=0.0)  # A = 1 > 0 and ratio 3 > 2: masked
    result = compute_rl_loss(
        new, old, torch.ones(2), torch.ones(2), torch.tensor([1, 1]), [NO_KL, strict]
    )
    assert result.masked_fraction.tolist() == [0.0, 1.0]
    assert result.run_loss.tolist() == pytest.approx([-3.0, 0.0], rel=1e-6)


def test_a_step_wide_token_count_makes_split_micro_batches_add_up_to_one():
    new, old = logprobs_with_ratios([1.0, 1.2, 0.9, 1.1, 0.8])
    advantages = torch.tensor([0.5, -1.0, 2.0, 0.3, -0.7])
    whole = compute_rl_loss(new, old, advantages, torch.ones(5), torch.tensor([5]))
    (whole_grad,) = torch.autograd.grad(whole.loss, new)

    step_tokens = torch.tensor([5])
    parts = [
        compute_rl_loss(
            new[s], old[s], advantages[s], torch.ones(n), torch.tensor([n]), None, step_tokens
        )
        for s, n in ((slice(0, 2), 2), (slice(2, 5), 3))
    ]
    (split_grad,) = torch.autograd.grad(parts[0].loss + parts[1].loss, new)
    torch.testing.assert_close(split_grad, whole_grad)
    assert (parts[0].loss + parts[1].loss).item() == pytest.approx(whole.loss.item(), rel=1e-6)


def test_mismatched_lengths_are_refused_with_the_sizes():
    new, old = logprobs_with_ratios([1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="sums to 4 but there are 3 tokens"):
        compute_rl_loss(new, old, torch.ones(3), torch.ones(3), torch.tensor([2, 2]))
    with pytest.raises(ValueError, match="one value per token"):
        compute_rl_loss(new, old, torch.ones(2), torch.ones(3), torch.tensor([3]))


# ---------------------------------------------------------------------------- log-probs


def test_compute_logprobs_is_the_shifted_log_softmax_and_has_its_gradient():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 11, generator=generator, requires_grad=True)
    input_ids = torch.randint(0, 11, (2, 7), generator=generator)
    temperature = 0.7

    ours = compute_logprobs(logits, input_ids, temperature, chunk_size=3)
    reference = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)
    reference = reference.gather(-1, input_ids[:, 1:, None]).squeeze(-1)

    assert ours.shape == (2, 7) and ours.dtype == torch.float32
    assert torch.equal(ours[:, 0], torch.zeros(2))
    torch.testing.assert_close(ours[:, 1:], reference)
    weights = torch.randn(2, 6, generator=generator)
    (our_grad,) = torch.autograd.grad((ours[:, 1:] * weights).sum(), logits)
    (reference_grad,) = torch.autograd.grad((reference * weights).sum(), logits)
    torch.testing.assert_close(our_grad, reference_grad)


def test_compute_logprobs_takes_one_unbatched_row():
    logits = torch.randn(5, 9)
    input_ids = torch.tensor([1, 4, 2, 8, 0])
    batched = compute_logprobs(logits[None], input_ids[None])[0]
    torch.testing.assert_close(compute_logprobs(logits, input_ids), batched)
