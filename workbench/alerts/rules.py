"""The alert rules: pure state machines over one run's records, and the checks of time.

Each record rule follows one run's metrics.jsonl records in file order (`observe`) and
returns a `Finding` when a condition begins; it stays quiet while the condition lasts and
is armed again once it has ended, so an episode raises one alert, not one per record. The
finding's key names the episode (the step it began at): records read again from the start,
by a supervisor that restarted, find the same keys, which the watcher has already written.

`stalled` and `failure_burst` look at time rather than records: a run that records nothing,
a process whose exits come too close together.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.config.alerts import AlertsSection

# Steps averaged into the reward level that reward_collapse compares: one step's mean
# reward of a few prompts jumps about; three steps' mean is what a curve shows.
REWARD_SMOOTHING = 3
# Previous updates whose median is the KL's usual level, and how many it needs first.
KL_HISTORY = 10
KL_MIN_HISTORY = 3


@dataclass(frozen=True)
class Finding:
    rule: str
    key: str
    message: str
    step: int | None = None
    values: dict[str, Any] = field(default_factory=dict)


def number(record: dict[str, Any], key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _step(record: dict[str, Any]) -> int | None:
    step = record.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


class RewardCollapse:
    """The orchestrator's mean reward (of the last 3 written steps) `drop` below its highest
    over the last `window` steps. Armed again once it is back within half the drop."""

    rule = "reward_collapse"

    def __init__(self, drop: float, window: int):
        self.drop = drop
        self.recent: deque[float] = deque(maxlen=REWARD_SMOOTHING)
        self.levels: deque[tuple[float, int]] = deque(maxlen=window)
        self.active = False

    def observe(self, record: dict[str, Any]) -> Finding | None:
        reward, step = number(record, "reward_mean"), _step(record)
        if record.get("source") != "orchestrator" or record.get("written") is False:
            return None
        if reward is None or step is None or not math.isfinite(reward):
            return None
        self.recent.append(reward)
        if len(self.recent) < REWARD_SMOOTHING:
            return None
        level = sum(self.recent) / len(self.recent)
        self.levels.append((level, step))
        peak, peak_step = max(self.levels)
        fallen = peak - level
        if self.active:
            self.active = fallen > self.drop / 2
            return None
        if fallen < self.drop:
            return None
        self.active = True
        return Finding(
            self.rule,
            f"step {step}",
            f"reward collapsed: {level:.3f} at step {step} (mean of the last "
            f"{REWARD_SMOOTHING} steps), down {fallen:.3f} from {peak:.3f} at step {peak_step}",
            step,
            {"reward": round(level, 6), "peak": round(peak, 6), "peak_step": peak_step},
        )


class EvalRegression:
    """A held-out eval `drop` below the best earlier eval of the run. Armed again by an eval
    back within half the drop of the best."""

    rule = "eval_regression"

    def __init__(self, drop: float):
        self.drop = drop
        self.best: tuple[float, int] | None = None
        self.active = False

    def observe(self, record: dict[str, Any]) -> Finding | None:
        value, step = number(record, "eval_reward_mean"), _step(record)
        if record.get("source") != "eval" or value is None or step is None:
            return None
        if not math.isfinite(value):
            return None
        best = self.best
        if best is None or value > best[0]:
            self.best = (value, step)
        if best is None:
            return None
        fallen = best[0] - value
        if self.active:
            self.active = fallen > self.drop / 2
            return None
        if fallen < self.drop:
            return None
        self.active = True
        return Finding(
            self.rule,
            f"step {step}",
            f"eval regressed: held-out reward {value:.3f} at step {step}, down {fallen:.3f} "
            f"from {best[0]:.3f} at step {best[1]}",
            step,
            {"eval_reward_mean": value, "best": best[0], "best_step": best[1]},
        )


class NonFinite:
    """A trainer update whose loss or gradient norm is NaN or infinite. Armed again by a
    finite update (the trainer evicts a run after 3 in a row)."""

    rule = "non_finite"

    def __init__(self) -> None:
        self.active = False

    def observe(self, record: dict[str, Any]) -> Finding | None:
        step = _step(record)
        if record.get("source") != "trainer" or step is None:
            return None
        values = {
            key: value
            for key in ("loss", "grad_norm")
            if (value := number(record, key)) is not None
        }
        if not values:
            return None
        bad = [key for key, value in values.items() if not math.isfinite(value)]
        was_active, self.active = self.active, bool(bad)
        if not bad or was_active:
            return None
        said = ", ".join(f"{key} {values[key]}" for key in bad)
        return Finding(
            self.rule, f"step {step}", f"non-finite {said} at update {step}", step, values
        )


class KlSpike:
    """An update's `base_kl` (the KL estimate to the base model) at least `factor` times the
    median of the previous updates' and at least `minimum`. A spike is left out of the
    median, so a lasting one stays one episode."""

    rule = "kl_spike"

    def __init__(self, factor: float, minimum: float):
        self.factor = factor
        self.minimum = minimum
        self.history: deque[float] = deque(maxlen=KL_HISTORY)
        self.active = False

    def observe(self, record: dict[str, Any]) -> Finding | None:
        kl, step = number(record, "base_kl"), _step(record)
        if record.get("source") != "trainer" or kl is None or step is None:
            return None
        usual = statistics.median(self.history) if len(self.history) >= KL_MIN_HISTORY else None
        spike = (
            usual is not None
            and kl >= self.minimum
            and (not math.isfinite(kl) or kl >= self.factor * usual)
        )
        was_active, self.active = self.active, spike
        if not spike:
            if math.isfinite(kl):
                self.history.append(kl)
            return None
        if was_active:
            return None
        return Finding(
            self.rule,
            f"step {step}",
            f"KL to the base spiked: {kl:.4g} at update {step}, its median over the "
            f"previous updates {usual:.4g}",
            step,
            {"base_kl": kl, "median": usual},
        )


class RatioSpike:
    """An update whose mean importance ratio (trainer / sampler) is above `limit` or below
    1 / `limit`: the trainer's policy is not the one that sampled. A NaN ratio is left to
    non_finite (its loss is NaN too)."""

    rule = "ratio_spike"

    def __init__(self, limit: float):
        self.limit = limit
        self.active = False

    def observe(self, record: dict[str, Any]) -> Finding | None:
        ratio, step = number(record, "ratio_mean"), _step(record)
        if record.get("source") != "trainer" or ratio is None or step is None:
            return None
        if math.isnan(ratio):
            return None  # a NaN update is non_finite's alert; this one goes on as it was
        off = not (1 / self.limit <= ratio <= self.limit)
        was_active, self.active = self.active, off
        if not off or was_active:
            return None
        values = {"ratio_mean": ratio}
        for key in ("ratio_min", "ratio_max"):
            if (value := number(record, key)) is not None:
                values[key] = value
        return Finding(
            self.rule,
            f"step {step}",
            f"importance ratio spiked: mean {ratio:.4g} at update {step} (allowed "
            f"{1 / self.limit:.3g} to {self.limit:g})",
            step,
            values,
        )


RecordRule = RewardCollapse | EvalRegression | NonFinite | KlSpike | RatioSpike


def record_rules(section: AlertsSection) -> list[RecordRule]:
    """A fresh set of the record rules the section checks, for one run."""
    rules: list[RecordRule] = [
        RewardCollapse(section.reward_drop, section.reward_window),
        EvalRegression(section.eval_drop),
        NonFinite(),
        KlSpike(section.kl_factor, section.kl_min),
        RatioSpike(section.ratio_limit),
    ]
    return [rule for rule in rules if section.checks(rule.rule)]


def stalled(last_record_time: float | None, now: float, stall_s: float) -> bool:
    """Whether a run whose last record was written at `last_record_time` has gone `stall_s`
    without another; never for a run that has recorded nothing (it may wait for a slot)."""
    return last_record_time is not None and now - last_record_time >= stall_s


def failure_burst(
    failure_times: Sequence[float], now: float, count: int, window_s: float
) -> list[float]:
    """The failed exits within `window_s` before `now` when there are at least `count` of
    them (oldest first), else []."""
    recent = sorted(t for t in failure_times if now - window_s <= t <= now)
    return recent if len(recent) >= count else []
