"""A run's recent samples as text: what the rollout browser shows.

The rollouts the trainer reads hold token ids only. For a person reading what the policy
writes, each orchestrator step also records its prompts and every completion decoded, with
reward, GRPO advantage and whether generation stopped at `max_tokens`, grouped by prompt, in
`run_<id>/samples.jsonl`: one JSON line per step, the last `KEEP_STEPS` steps only. The file
is rewritten atomically at each step, so a reader never sees half a step and the file stays
small (about 20 KB a step for the shipped recipes' 16 prompts x 8 short completions).

A batch dropped for lack of learning signal is recorded too (`written` false): it is the
first thing to look at when a run stalls. Its step number is then shared with the retry
that follows; `find_step` returns the last attempt.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workbench.files import layout

KEEP_STEPS = 8


@dataclass(frozen=True)
class SampledCompletion:
    text: str
    reward: float
    advantage: float
    truncated: bool
    tokens: int


@dataclass(frozen=True)
class SampleGroup:
    """One prompt and its `rollouts_per_prompt` completions (one GRPO group)."""

    prompt: str
    answer: str
    completions: list[SampledCompletion]

    @property
    def rewards(self) -> list[float]:
        return [c.reward for c in self.completions]

    @property
    def reward_mean(self) -> float:
        return statistics.fmean(self.rewards)

    @property
    def reward_spread(self) -> float:
        """Standard deviation of the group's rewards: zero means nothing to learn from it."""
        return statistics.pstdev(self.rewards)


@dataclass(frozen=True)
class StepSamples:
    step: int
    policy_version: int
    written: bool
    groups: list[SampleGroup]
    time: float = field(default_factory=time.time)

    @property
    def rewards(self) -> list[float]:
        return [reward for group in self.groups for reward in group.rewards]

    @property
    def reward_mean(self) -> float:
        return statistics.fmean(self.rewards) if self.groups else 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> StepSamples:
        groups = [
            SampleGroup(
                prompt=group["prompt"],
                answer=group["answer"],
                completions=[SampledCompletion(**c) for c in group["completions"]],
            )
            for group in record["groups"]
        ]
        return cls(
            step=record["step"],
            policy_version=record["policy_version"],
            written=record["written"],
            groups=groups,
            time=record["time"],
        )


def record_step(run: Path, samples: StepSamples, keep: int = KEEP_STEPS) -> None:
    """Append `samples` to the run's file, dropping all but the newest `keep` steps."""
    kept = _read_lines(layout.samples_path(run))[-(keep - 1) :] if keep > 1 else []
    kept.append(json.dumps(samples.to_json(), separators=(",", ":")))
    layout.atomic_write_text(layout.samples_path(run), "\n".join(kept) + "\n")


def read_steps(run: Path) -> list[StepSamples]:
    """The recorded steps, oldest first; an unreadable line is skipped."""
    steps = []
    for line in _read_lines(layout.samples_path(run)):
        try:
            steps.append(StepSamples.from_json(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return steps


def find_step(steps: list[StepSamples], step: int | None = None) -> StepSamples | None:
    """The last attempt at `step` (the newest step when None), or None."""
    matching = [s for s in steps if step is None or s.step == step]
    return matching[-1] if matching else None


def reward_histogram(rewards: list[float], bins: int = 10) -> list[tuple[float, float, int]]:
    """(low, high, count) for `bins` equal-width bins from the lowest to the highest reward.

    Every reward of the built-in environments lies in [0, 1]; the bins cover exactly the
    range seen, so a step whose rewards all lie in 0.8-0.9 is still spread over the bins.
    """
    if not rewards:
        return []
    low, high = min(rewards), max(rewards)
    if high == low:
        return [(low, high, len(rewards))]
    width = (high - low) / bins
    counts = [0] * bins
    for reward in rewards:
        counts[min(int((reward - low) / width), bins - 1)] += 1
    return [(low + i * width, low + (i + 1) * width, n) for i, n in enumerate(counts)]


def _read_lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line]
    except FileNotFoundError:
        return []


def describe_step(samples: StepSamples, bar_width: int = 20) -> list[str]:
    """The step as plain text lines: a header, the reward histogram, then each group with
    its completions, best first (what `workbench samples` prints)."""
    state = "trained" if samples.written else "dropped: no learning signal"
    lines = [
        f"step {samples.step}  policy version {samples.policy_version}  {state}  "
        f"reward mean {samples.reward_mean:.3f}  {len(samples.groups)} groups",
        "rewards:",
    ]
    bins = reward_histogram(samples.rewards)
    most = max((count for _, _, count in bins), default=0)
    for low, high, count in bins:
        bar = "#" * (round(bar_width * count / most) if most else 0)
        lines.append(f"  {low:5.2f}-{high:5.2f} {bar:<{bar_width}} {count}")
    for number, group in enumerate(samples.groups, start=1):
        lines.append(
            f"group {number}: mean {group.reward_mean:.2f} spread {group.reward_spread:.2f}  "
            f"prompt {group.prompt!r}  answer {group.answer!r}"
        )
        for completion in sorted(group.completions, key=lambda c: c.reward, reverse=True):
            cut = "  [cut at max_tokens]" if completion.truncated else ""
            lines.append(
                f"  {completion.reward:5.2f} {completion.advantage:+5.2f}  {completion.text!r}{cut}"
            )
    return lines
