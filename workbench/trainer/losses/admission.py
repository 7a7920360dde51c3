"""A run's loss tried once before it gets a trainer slot: a user's loss that raises or
returns the wrong shape rejects its run (the run's `config_validation_error.txt` says why)
instead of stopping the trainer that every run shares."""

from __future__ import annotations

import torch

from workbench.config import OrchestratorConfig, UserLoss
from workbench.trainer.losses import loss_function
from workbench.trainer.losses.inputs import LossInputs, TokenLoss


def sample_inputs(config: OrchestratorConfig) -> LossInputs:
    """Two completions of three and two loss tokens (a prompt token before each), with
    log-probs near the sampler's and advantages of both signs."""
    logprobs = torch.tensor([0.0, -1.2, -0.7, -2.1, 0.0, -0.4, -1.5]).requires_grad_()
    return LossInputs(
        logprobs=logprobs,
        sampler_logprobs=torch.tensor([0.0, -1.0, -0.9, -2.0, 0.0, -0.5, -1.2]),
        advantages=torch.tensor([0.5, 0.5, 0.5, 0.5, -0.5, -0.5, -0.5]),
        loss_mask=torch.tensor([False, True, True, True, False, True, True]),
        sample_index=torch.tensor([0, 0, 0, 0, 1, 1, 1]),
        num_samples=2,
        config=config.loss,
        args=config.loss.args if isinstance(config.loss, UserLoss) else {},
    )


def loss_problem(config: OrchestratorConfig) -> str | None:
    """Why the run's loss cannot train, found by calling it on `sample_inputs`; or None.
    Built-in kinds are tested with the project and pass without a call."""
    kind = config.loss.kind
    if ":" not in kind:
        return None
    inputs = sample_inputs(config)
    try:
        result = loss_function(kind)(inputs)
    except Exception as err:  # whatever the user's code raises, the run is what fails
        return f"loss.kind {kind!r} raised {type(err).__name__}: {err}"
    if not isinstance(result, TokenLoss):
        return f"loss.kind {kind!r} returned {type(result).__name__}, not a TokenLoss"
    shape = tuple(inputs.logprobs.shape)
    if not isinstance(result.loss, torch.Tensor) or tuple(result.loss.shape) != shape:
        return (
            f"loss.kind {kind!r}: TokenLoss.loss must be a tensor of shape {shape} (one per token)"
        )
    if not torch.isfinite(result.loss[inputs.loss_mask]).all():
        return f"loss.kind {kind!r} gave a non-finite loss on ordinary log-probs"
    return None


def validate_run_loss(config: OrchestratorConfig) -> tuple[bool, str]:
    """The trainer's config validation hook (`MultiRunManager`)."""
    problem = loss_problem(config)
    return problem is None, problem or ""
