"""GRPO advantages: each completion's reward minus the mean reward of its prompt's group."""

from __future__ import annotations


def group_advantages(rewards: list[float], group_size: int) -> list[float]:
    """`rewards` holds consecutive groups of `group_size` completions of one prompt each."""
    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    advantages = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / group_size
        advantages.extend(r - mean for r in group)
    return advantages


def has_learning_signal(advantages: list[float], tolerance: float = 1e-9) -> bool:
    """False when every advantage is zero: every group scored all its completions alike."""
    return any(abs(a) > tolerance for a in advantages)


def steps_ahead_allowed(step: int, loaded_version: int, async_level: int) -> bool:
    """May step `step` be generated with the adapter of step `loaded_version`?

    The orchestrator stays at most `async_level` steps ahead of the newest adapter it has
    loaded: step n needs version >= n - async_level (version 0 is the base model).
    """
    return step - loaded_version <= async_level
