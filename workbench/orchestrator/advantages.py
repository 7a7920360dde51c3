"""Advantages: each completion's reward against its prompt's group, within one run's step.

The default (`group_advantages`) is Dr. GRPO's and prime-rl's: the reward minus its
group's mean. `compute_advantages` adds the other estimators a run may choose
(`advantage.baseline`, `advantage.scale`; verl's `core_algos.py`:
`compute_rloo_outcome_advantage`, `compute_grpo_outcome_advantage`,
`compute_reinforce_plus_plus_baseline_outcome_advantage`):

- baseline `leave_one_out` (RLOO): `R_i - sum_{j != i} R_j / (G - 1)`;
- scale `group_std` (GRPO, verl): divided by the group's std + eps (unbiased std, as
  torch's; a group of equal rewards has advantages 0 whatever eps is);
- scale `batch_std` (REINFORCE++-baseline): divided by the std of the step's centred
  rewards + eps, the std taken over this run's completions only, never another run's.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from workbench.config import AdvantageConfig

GroupSizes = int | Sequence[int]


def group_advantages(rewards: list[float], group_size: GroupSizes) -> list[float]:
    """`rewards` holds consecutive groups of one prompt's completions each: `group_size`
    each, or the size of each group in order (an environment may drop a failed episode)."""
    advantages = []
    for group in split_groups(rewards, group_size, minimum=1):
        mean = sum(group) / len(group)
        advantages.extend(r - mean for r in group)
    return advantages


def split_groups(
    rewards: list[float], group_size: GroupSizes, *, minimum: int
) -> list[list[float]]:
    """`rewards` cut into its groups; ValueError when the sizes do not fit them, or a group
    is smaller than `minimum`."""
    if isinstance(group_size, int):
        if group_size < minimum or len(rewards) % group_size:
            raise ValueError(
                f"{len(rewards)} rewards do not split into groups of {group_size} >= {minimum}"
            )
        sizes = [group_size] * (len(rewards) // group_size)
    else:
        sizes = list(group_size)
        if sum(sizes) != len(rewards) or any(size < minimum for size in sizes):
            raise ValueError(
                f"{len(rewards)} rewards do not split into groups of {sizes} (each >= {minimum})"
            )
    groups, start = [], 0
    for size in sizes:
        groups.append(rewards[start : start + size])
        start += size
    return groups


def compute_advantages(
    rewards: list[float], group_size: GroupSizes, config: AdvantageConfig | None = None
) -> list[float]:
    """The run's advantages for one step as its `advantage` settings say; `rewards` holds
    consecutive groups of one prompt's completions each (`group_size` each, or each group's
    size in order)."""
    config = config or AdvantageConfig()
    if config.baseline == "group_mean" and config.scale == "none":
        return group_advantages(rewards, group_size)  # today's, bit for bit
    advantages: list[float] = []
    for group in split_groups(rewards, group_size, minimum=2):
        size = len(group)
        mean = sum(group) / size
        if config.baseline == "leave_one_out":
            centred = [(r - mean) * size / (size - 1) for r in group]
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
