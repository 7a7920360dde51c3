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
- With fewer than `min_runs` values at the rung (its own included), the judgement waits
  ("too_few"): a cutoff over two or three runs is mostly noise. When the `min_runs`-th
  value arrives, every run waiting at that rung is judged against all the values there,
  just after the arrival itself. Without this, the first `min_runs - 1` arrivals would go
  on unjudged, and runs that started together (the first trainer slots) reach every rung
  together: the same early arrivals would pass every rung for free. Ray has no such guard
  (the first run at a rung always goes on, the second is compared with the first).
- Ray leaves the run being judged out of the cutoff; here it is in, so that the cutoff
  and the rank `k/n` are over the same `n` runs.
- Every judged value is recorded, stopped or not, and counts for later arrivals, also
  after its run crashed, finished or was evicted by hand.
- A run stopped at a rung is not judged at later rungs while it stays evicted; a user
  who restarts it (`workbench restart`) puts it back in the race from the next rung.
- A run that diverged (the trainer evicted it: `run_control.is_divergence`) is done, and
  the worst: at the next rung it had not reached, it counts as a value worse than any
  other, from the time it was evicted (decision "diverged", no value, no rank), as
  successive halving would rank a trial that went to nan. So it fills its place towards
  `min_runs` instead of leaving the runs there waiting for a value that never comes, and
  it never raises the cutoff above the worst real value (a cutoff that would fall among
  diverged runs is that value: nobody is stopped for ranking just above a diverged run).
  Beyond that rung it is out of the race, as a stopped run is; restarted, it is judged
  again from the rung after. (Ray Tune leaves an errored trial out of every rung.)

Decisions are final: `advance` only adds results for (run, rung) pairs it has not
decided (a "too_few" is followed by one judgement once the rung has `min_runs` values),
in the order the runs reached their rungs (record time, then run id), so replaying the
same records gives the same decisions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from workbench.sweep.spec import AshaSpec

Decision = Literal["continue", "stop", "too_few", "no_value", "diverged"]
# Decisions that take a run out of the race until it is restarted.
OUT_OF_THE_RACE = ("stop", "diverged")


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
    diverged_at: float | None = None  # evicted for divergence now: when (unix seconds)


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
    """The q-quantile by linear interpolation between order statistics (numpy's default);
    between an infinity (a diverged run's place) and a number, that infinity."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    below, above = ordered[low], ordered[high]
    if position == low or below == above:
        return below
    if math.isinf(below) or math.isinf(above):
        return below if math.isinf(below) else above
    return below + (above - below) * (position - low)


def judge(
    recorded: Sequence[float], value: float, spec: AshaSpec
) -> tuple[int, int, float | None, Decision]:
    """Rank, count, cutoff and decision for `value` among the values `recorded` at a rung
    before it (its own value is added here). A diverged run's place is an infinity on the
    bad side (`worst`); the cutoff is kept within the values that are numbers."""
    values = [*recorded, value]
    better = sum(1 for other in recorded if _better(other, value, spec.mode))
    rank, count = better + 1, len(values)
    if count < spec.min_runs:
        return rank, count, None, "too_few"
    numbers = [v for v in values if math.isfinite(v)]
    if spec.mode == "max":
        cutoff = quantile(values, 1 - 1 / spec.reduction_factor)
    else:
        cutoff = quantile(values, 1 / spec.reduction_factor)
    cutoff = min(max(cutoff, min(numbers)), max(numbers))
    stop = value < cutoff if spec.mode == "max" else value > cutoff
    return rank, count, cutoff, "stop" if stop else "continue"


def worst(mode: str) -> float:
    """The place of a diverged run among a rung's values: worse than any number."""
    return -math.inf if mode == "max" else math.inf


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
    stopped = {r.run_id for r in results if r.decision in OUT_OF_THE_RACE}
    # (when, rung, run, step, its value there, whether it diverged before reaching it)
    pending: list[tuple[float, int, str, int, float | None, bool]] = []
    for curve in curves:
        if curve.run_id in stopped and curve.evicted:
            continue  # stopped here and still out: nothing more to judge
        for rung, step in enumerate(spec.rung_steps(curve.max_steps)):
            if (curve.run_id, rung) in decided:
                continue
            when = reached_at(curve, step)
            if when is None:
                if curve.diverged_at is not None:  # it never will: the worst there
                    pending.append((curve.diverged_at, rung, curve.run_id, step, None, True))
                break  # rungs are reached in order
            value = value_at(curve.points, step)
            pending.append((when, rung, curve.run_id, step, value, False))
    pending.sort(key=lambda item: (item[0], item[1], item[2]))

    rungs = _Rungs(results, spec)
    new: list[RungResult] = []
    # Waiting judgements whose rung filled up before (a file written by an older build).
    for rung in sorted(rungs.waiting):
        new += rungs.judge_waiting(rung, max(r.reached_at for r in results if r.rung == rung))
    for when, rung, run_id, step, value, diverged in pending:
        if run_id in rungs.halted:
            continue  # stopped at a lower rung in this same pass
        if diverged:
            new.append(rungs.diverged(run_id, rung, step, when))
            new += rungs.judge_waiting(rung, when)
            continue
        if value is None or not math.isfinite(value):
            of = len(rungs.values.get(rung, {}))
            new.append(RungResult(run_id, rung, step, None, None, of, None, "no_value", when))
            continue
        result = rungs.judge(run_id, rung, step, value, when)
        new.append(result)
        if result.decision == "too_few":
            rungs.waiting.setdefault(rung, []).append(result)
        else:
            new += rungs.judge_waiting(rung, when)
    return new


class _Rungs:
    """The values recorded at each rung (one per run; a diverged run's is `worst`) and the
    runs waiting to be judged."""

    def __init__(self, results: Sequence[RungResult], spec: AshaSpec) -> None:
        self.spec = spec
        self.values: dict[int, dict[str, float]] = {}
        self.halted: set[str] = set()  # stopped in this pass
        # Stopped and not judged since: out of the race (a restarted run is judged again).
        self.out: set[str] = set()
        judged = {(r.run_id, r.rung) for r in results if r.decision in ("continue", "stop")}
        self.waiting: dict[int, list[RungResult]] = {}
        for result in results:
            if result.decision in OUT_OF_THE_RACE:
                self.out.add(result.run_id)
            else:
                self.out.discard(result.run_id)
            if result.decision == "diverged":
                self.values.setdefault(result.rung, {})[result.run_id] = worst(spec.mode)
            elif result.value is not None:
                self.values.setdefault(result.rung, {})[result.run_id] = result.value
            if result.decision == "too_few" and (result.run_id, result.rung) not in judged:
                self.waiting.setdefault(result.rung, []).append(result)

    def judge(self, run_id: str, rung: int, step: int, value: float, when: float) -> RungResult:
        recorded = self.values.setdefault(rung, {})
        others = [v for other, v in recorded.items() if other != run_id]
        rank, count, cutoff, decision = judge(others, value, self.spec)
        recorded[run_id] = value
        if decision == "stop":
            self.halted.add(run_id)
        return RungResult(run_id, rung, step, value, rank, count, cutoff, decision, when)

    def diverged(self, run_id: str, rung: int, step: int, when: float) -> RungResult:
        """The place at `rung` of a run that diverged before it: last, whoever comes after
        (no rank: a rank is a standing at the time, and later runs all rank above it)."""
        recorded = self.values.setdefault(rung, {})
        recorded[run_id] = worst(self.spec.mode)
        self.halted.add(run_id)
        return RungResult(run_id, rung, step, None, None, len(recorded), None, "diverged", when)

    def judge_waiting(self, rung: int, when: float) -> list[RungResult]:
        """Judge the runs waiting at `rung` if it has enough values now (at time `when`)."""
        if len(self.values.get(rung, {})) < self.spec.min_runs:
            return []
        results = []
        for waiting in self.waiting.pop(rung, []):
            if waiting.run_id in self.halted or waiting.run_id in self.out:
                continue  # stopped at another rung meanwhile: out of the race already
            assert waiting.value is not None
            results.append(self.judge(waiting.run_id, rung, waiting.step, waiting.value, when))
        return results


def latest_by_run(results: Iterable[RungResult]) -> dict[str, RungResult]:
    """Each run's result at its highest rung so far (what `workbench status` shows), or a
    stop decided after it (a judgement that waited for enough runs at a lower rung)."""
    latest: dict[str, RungResult] = {}
    for result in results:  # in decision order
        current = latest.get(result.run_id)
        if current is None or result.rung >= current.rung or result.decision in OUT_OF_THE_RACE:
            latest[result.run_id] = result
    return latest


def _distinct_numbers(a: float, b: float) -> tuple[str, str]:
    """Both numbers with 4 significant digits, or more if that would print them alike."""
    for digits in range(4, 12):
        shown_a, shown_b = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if shown_a != shown_b:
            return shown_a, shown_b
    return shown_a, shown_b
