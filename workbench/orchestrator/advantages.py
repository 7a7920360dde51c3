"""Advantages: each completion's reward against its prompt's group, within one run's step.

The default (`group_advantages`) is Dr. GRPO's and prime-rl's: the reward minus its
group's mean. `compute_advantages` adds the other estimators a run may choose
(`advantage.baseline`, `advantage.scale`, ../shared/reference/rl-algorithms.md, section 4):

- baseline `leave_one_out` (RLOO): `R_i - sum_{j != i} R_j / (G - 1)`;
- scale `group_std` (GRPO, verl): divided by the group's std + eps (unbiased std, as
  torch's; a group of equal rewards has advantages 0 whatever eps is);
- scale `batch_std` (REINFORCE++-baseline): divided by the std of the step's centred
  rewards + eps, the std taken over this run's completions only, never another run's.
"""

from __future__ import annotations

import statistics

from workbench.config import AdvantageConfig


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


def compute_advantages(
    rewards: list[float], group_size: int, config: AdvantageConfig | None = None
) -> list[float]:
    """The run's advantages for one step as its `advantage` settings say; `rewards` holds
    consecutive groups of `group_size` completions of one prompt each."""
    config = config or AdvantageConfig()
    if config.baseline == "group_mean" and config.scale == "none":
        return group_advantages(rewards, group_size)  # today's, bit for bit
    if group_size < 2 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size} >= 2")
    advantages: list[float] = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / group_size
        if config.baseline == "leave_one_out":
            centred = [(r - mean) * group_size / (group_size - 1) for r in group]
        else:
            centred = [r - mean for r in group]
        if config.scale == "group_std":
            std = statistics.stdev(group)
            centred = [a / (std + config.std_eps) for a in centred]
        advantages.extend(centred)
    if config.scale == "batch_std" and len(advantages) > 1:
        std = statistics.stdev(advantages)
        advantages = [a / (std + config.std_eps) for a in advantages]
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
