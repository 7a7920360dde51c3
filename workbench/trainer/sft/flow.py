"""`workbench sft` in one flow: command-line settings in, a trained model or adapter out.

    result = run_sft(settings, env_args=["max_length=8"], progress=print)

The settings are validated into an `SFTConfig` (`SFTInputError` names what is wrong:
a bad option, an unknown environment or env argument, a model that cannot be resolved),
`train_sft` trains and saves, and the result comes back; an OSError (disk full, unreadable
data) is left to the caller as the failure it is. `describe_result` is the one-line
summary. torch is imported only when training starts, so the CLI stays quick.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console

from workbench.config import parse_assignment

if TYPE_CHECKING:
    from workbench.trainer.sft.train import SFTResult


class SFTInputError(Exception):
    """Settings, environment, data or model that supervised fine-tuning cannot use."""


def run_sft(
    settings: dict[str, Any],
    *,
    env_args: list[str] | None = None,
    lora_rank: int | None = None,
    lora_alpha: float = 16.0,
    console: Console | None = None,
    progress: Callable[[str], None] | None = None,
) -> SFTResult:
    """Train as `settings` (fields of `SFTConfig`) say; `env_args` are KEY=VALUE strings,
    `lora_rank` None trains every weight. `progress` receives one line per log entry."""
    from pydantic import ValidationError

    from workbench.envs import EnvironmentConfigError
    from workbench.models import ModelResolutionError, resolve_model
    from workbench.trainer.sft.train import SFTConfig, SFTLoraConfig, train_sft

    try:
        config = SFTConfig(
            **settings,
            env_args=dict(parse_assignment(item) for item in env_args or []),
            lora=None if lora_rank is None else SFTLoraConfig(rank=lora_rank, alpha=lora_alpha),
        )
    except (ValueError, ValidationError) as err:
        raise SFTInputError(f"invalid sft options: {err}") from None
    on_log = None if progress is None else (lambda entry: progress(describe_log(entry)))
    try:
        model = resolve_model(config.model, console=console)
        return train_sft(
            config.model_copy(update={"model": str(model)}), console=console, on_log=on_log
        )
    except (EnvironmentConfigError, ModelResolutionError, ValueError) as err:
        raise SFTInputError(str(err)) from None


def describe_log(entry: dict[str, Any]) -> str:
    if "eval_reward" in entry:
        return f"step {entry['step']}: eval reward {entry['eval_reward']:.4f}"
    return f"step {entry['step']}: loss {entry['loss']:.4f}, lr {entry['lr']:.2e}"


def describe_result(result: SFTResult, *, lora: bool) -> str:
    reward = result.final_reward
    return (
        f"saved {'LoRA adapter' if lora else 'model'} to {result.output_dir} "
        f"({result.trainable_params:,} trainable parameters, {result.seconds:.0f} s); "
        f"loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f}"
        + (f"; eval reward {reward:.4f}" if reward is not None else "")
    )
