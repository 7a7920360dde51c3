"""Early stopping by asynchronous successive halving (ASHA), as a pure function.

Semantics follow Ray Tune's `AsyncHyperBandScheduler`, the familiar reference:

- Rungs sit at steps `grace_steps * reduction_factor**k` below a run's `max_steps`
  (grace 5, factor 2: steps 5, 10, 20, ...; rung k is the one at the k-th of them).
- Asynchronous: a run is judged once per rung, when it reaches it, against every run
  that has recorded that rung so far (earlier arrivals never wait for later ones, and
  are never judged again at that rung). Runs that join late are judged against all.
- A run's value at a rung is its latest record of the metric at or before the rung's
  step. It reaches the rung when a record of the metric at or past that step appears,
  or when it finishes. A run without any record at or before the step is not judged
  there ("no_value") and does not count for others.
- The run is stopped when its value is worse than the cutoff: the (1 - 1/factor)
  quantile (linear interpolation, like numpy's percentile) of the values recorded at the
  rung, its own included; so at most the top 1/factor of the runs there go on. A value
  equal to the cutoff goes on (ties never stop a run). Rank 1 is the best; tied runs
  share a rank.
- With fewer than `min_runs` values at the rung (its own included), nobody is stopped
  ("too_few"): a cutoff over two or three runs is mostly noise. Ray has no such guard
  (the first run at a rung always goes on, the second is compared with the first).
- Ray leaves the run being judged out of the cutoff; here it is in, so that the cutoff
  and the rank `k/n` are over the same `n` runs.
- Every judged value is recorded, stopped or not, and counts for later arrivals, also
  after its run crashed, finished or was evicted by hand.
- A run stopped at a rung is not judged at later rungs while it stays evicted; a user
  who restarts it (`workbench restart`) puts it back in the race from the next rung.

Decisions are final: `advance` only adds results for (run, rung) pairs it has not
decided, in the order the runs reached their rungs (record time, then run id), so
replaying the same records gives the same decisions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from workbench.sweep.spec import AshaSpec

Decision = Literal["continue", "stop", "too_few", "no_value"]


@dataclass(frozen=True)
class MetricPoint:
    """One record of the metric in a run's metrics.jsonl."""

    step: int
    value: float
    time: float  # unix seconds, the record's "time"


@dataclass(frozen=True)
class RunCurve:
    """What the scheduler knows of one run: its records of the metric, in file order."""

    run_id: str
    points: tuple[MetricPoint, ...]
    max_steps: int
    finished: bool = False
    evicted: bool = False  # by anyone, now


@dataclass(frozen=True)
class RungResult:
    """The judgement of one run at one rung."""

    run_id: str
    rung: int
    step: int
    value: float | None
    rank: int | None
    of: int
    cutoff: float | None
    decision: Decision
    reached_at: float

    def reason(self, metric: str, mode: str) -> str:
        """`asha rung 2 (step 20): eval_reward_mean 0.41 < cutoff 0.55, rank 6/8`."""
        assert self.value is not None and self.cutoff is not None
        value, cutoff = _distinct_numbers(self.value, self.cutoff)
        sign = "<" if mode == "max" else ">"
        return (
            f"asha rung {self.rung} (step {self.step}): {metric} {value} {sign} cutoff "
            f"{cutoff}, rank {self.rank}/{self.of}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RungResult:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})


# ---------------------------------------------------------------- one judgement


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def judge(
    recorded: Sequence[float], value: float, spec: AshaSpec
) -> tuple[int, int, float | None, Decision]:
    """Rank, count, cutoff and decision for `value` among the values `recorded` at a rung
    before it (its own value is added here)."""
    values = [*recorded, value]
    better = sum(1 for other in recorded if _better(other, value, spec.mode))
    rank, count = better + 1, len(values)
    if count < spec.min_runs:
        return rank, count, None, "too_few"
    if spec.mode == "max":
        cutoff = quantile(values, 1 - 1 / spec.reduction_factor)
        stop = value < cutoff
    else:
        cutoff = quantile(values, 1 / spec.reduction_factor)
        stop = value > cutoff
    return rank, count, cutoff, "stop" if stop else "continue"


def _better(a: float, b: float, mode: str) -> bool:
    return a > b if mode == "max" else a < b


# ---------------------------------------------------------------- a run's value at a rung


def value_at(points: Sequence[MetricPoint], step: int) -> float | None:
    """The latest record at or before `step` (the last written of equal steps)."""
    best: MetricPoint | None = None
    for point in points:
        if point.step <= step and (best is None or point.step >= best.step):
            best = point
    return None if best is None else best.value


def reached_at(curve: RunCurve, step: int) -> float | None:
    """When the run reached `step`: the time of its first record at or past it, or of its
    last record once it finished; None if it has not."""
    for point in curve.points:
        if point.step >= step:
            return point.time
    if curve.finished and step < curve.max_steps:
        return curve.points[-1].time if curve.points else 0.0
    return None


# ---------------------------------------------------------------- many runs, many rungs


def advance(
    results: Sequence[RungResult], curves: Iterable[RunCurve], spec: AshaSpec
) -> list[RungResult]:
    """The new results that `curves` call for, in decision order; `results` are the
    decisions so far (never revisited)."""
    decided = {(r.run_id, r.rung) for r in results}
    stopped = {r.run_id for r in results if r.decision == "stop"}
    pending: list[tuple[float, int, str, int, float | None]] = []
    for curve in curves:
        if curve.run_id in stopped and curve.evicted:
            continue  # stopped here and still out: nothing more to judge
        for rung, step in enumerate(spec.rung_steps(curve.max_steps)):
            if (curve.run_id, rung) in decided:
                continue
            when = reached_at(curve, step)
            if when is None:
                break  # rungs are reached in order
            pending.append((when, rung, curve.run_id, step, value_at(curve.points, step)))
    pending.sort(key=lambda item: (item[0], item[1], item[2]))

    new: list[RungResult] = []
    halted: set[str] = set()
    by_rung: dict[int, list[float]] = {}
    for result in results:
        if result.value is not None:
            by_rung.setdefault(result.rung, []).append(result.value)
    for when, rung, run_id, step, value in pending:
        if run_id in halted:
            continue  # stopped at a lower rung in this same pass
        if value is None or not math.isfinite(value):
            recorded = by_rung.get(rung, [])
            new.append(
                RungResult(run_id, rung, step, None, None, len(recorded), None, "no_value", when)
            )
            continue
        recorded = by_rung.setdefault(rung, [])
        rank, count, cutoff, decision = judge(recorded, value, spec)
        recorded.append(value)
        new.append(RungResult(run_id, rung, step, value, rank, count, cutoff, decision, when))
        if decision == "stop":
            halted.add(run_id)
    return new


def latest_by_run(results: Iterable[RungResult]) -> dict[str, RungResult]:
    """Each run's result at its highest rung so far (what `workbench status` shows)."""
    latest: dict[str, RungResult] = {}
    for result in results:
        if result.run_id not in latest or result.rung >= latest[result.run_id].rung:
            latest[result.run_id] = result
    return latest


def _distinct_numbers(a: float, b: float) -> tuple[str, str]:
    """Both numbers with 4 significant digits, or more if that would print them alike."""
    for digits in range(4, 12):
        shown_a, shown_b = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if shown_a != shown_b:
            return shown_a, shown_b
    return shown_a, shown_b
