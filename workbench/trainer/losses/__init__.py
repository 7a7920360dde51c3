"""Policy losses by name: what one run's tokens contribute, before aggregation.

A loss is one function of one run's tokens in one packed micro-batch, `LossInputs`, that
returns each token's term, `TokenLoss`; `compute_rl_loss` (trainer/rl/loss.py) calls each run's
own loss on its own slice of the row, then aggregates per run, so runs with different losses
share one forward and backward and never see each other's tokens.

Adding a loss: write `def my_loss(inputs: LossInputs) -> TokenLoss` and either name it in a
run's config as `loss.kind = "package.module:my_loss"` (its arguments in `loss.args`), or
make it built in with `@register_loss("my_loss")` in `builtin.py` and a class of its knobs
in `workbench/config/loss.py` (the config refuses a kind or a knob it does not know, before
launch).

`inputs` holds `LossInputs` and `TokenLoss`; `builtin` the built-in losses; `tinker` Tinker's
losses (token sums, for the Tinker service's clients); `kl` the KL
estimators to the base model; `admission` tries a run's loss once before it gets a slot.
"""

from __future__ import annotations

from collections.abc import Callable

from workbench.config import LOSS_KINDS
from workbench.config.user_code import import_user_module
from workbench.trainer.losses.inputs import LossInputs, TokenLoss

LossFunction = Callable[[LossInputs], TokenLoss]

_REGISTRY: dict[str, LossFunction] = {}


def register_loss(name: str) -> Callable[[LossFunction], LossFunction]:
    """Decorator: `name` is a built-in `loss.kind`; its knobs are its class, `LOSS_KINDS[name]`."""
    if name not in LOSS_KINDS:
        raise ValueError(
            f"loss {name!r} has no class in workbench/config/loss.py; add one with "
            f'kind: Literal["{name}"] and its knobs, and list it in BUILTIN_LOSSES'
        )

    def register(function: LossFunction) -> LossFunction:
        _REGISTRY[name] = function
        return function

    return register


def loss_function(kind: str) -> LossFunction:
    """The function of a built-in kind, or of `package.module:function` (the config has
    checked that it loads and takes one argument)."""
    if kind in _REGISTRY:
        return _REGISTRY[kind]
    module_name, _, attribute = kind.partition(":")
    return getattr(import_user_module(module_name), attribute)


def registered_losses() -> list[str]:
    return list(_REGISTRY)


# Registers the built-in kinds.
from workbench.trainer.losses import builtin  # noqa: E402, F401

__all__ = ["LossFunction", "LossInputs", "TokenLoss", "loss_function", "register_loss"]
