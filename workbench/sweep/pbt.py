"""Population-based training (PBT) decisions, as pure functions.

Semantics follow Ray Tune's `PopulationBasedTraining`, the familiar reference:

- A run is judged at steps `interval, 2*interval, ...` after the step it started from
  (0, or the step of the checkpoint it was forked from) and below its `max_steps`. It
  reaches such a step with its first record of the metric at or past it; that record's
  value is the one judged (Ray: the trial's last result when it reaches the interval).
- It is ranked against the population at that moment: the latest value (by record time)
  of every other run still in the race (not evicted; finished runs count, as Ray's
  terminated trials do). With fewer than `min_runs` values, its own included, it goes on
  ("too_few").
- `k = ceil(n * quantile)`, at most `n // 2` (Ray's rule). The run is in the bottom
  quantile when its rank (1 + the runs strictly better) is above `n - k`: ties never put
  a run there. The top quantile is every other run whose rank is at most `k`.
- A run in the bottom quantile exploits ("exploit"): it takes the newest kept checkpoint
  (below its `max_steps`) of a run of the top quantile, chosen at random among those that
  keep one, with that run's settings, the `perturb` keys perturbed (`perturbed`). When no
  top run keeps such a checkpoint, it goes on ("no_source").
- A run without a value at the step (a record without the metric) is not judged there
  ("no_value").

Decisions are final: `decide` adds results only for (run, step) pairs not decided yet, in
the order the runs reached those steps (record time, then run id); the random choices are
seeded by (seed, run, step), so replaying the same records gives the same decisions.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from workbench.config import MAX_RUN_ID_CHARS
from workbench.sweep.asha import MetricPoint
from workbench.sweep.checks import Param
from workbench.sweep.expand import draw_value
from workbench.sweep.ids import SIGNIFICANT_DIGITS
from workbench.sweep.spec import PbtSpec
from workbench.sweep.values import show_value

Decision = Literal["exploit", "continue", "too_few", "no_value", "no_source"]
GENERATION = re.compile(r"^(?P<member>.+)-pbt(?P<generation>[0-9]+)$")


@dataclass(frozen=True)
class Member:
    """What PBT knows of one run of the population."""

    run_id: str
    points: tuple[MetricPoint, ...]  # its records of the metric, in file order
    max_steps: int
    start_step: int = 0  # the step of the checkpoint it was forked from
    in_race: bool = True  # not evicted (by anyone)
    kept_steps: tuple[int, ...] = ()  # the trainer's checkpoints it keeps now
    settings: Mapping[str, Any] = field(default_factory=dict)  # its value of each swept key

    def fork_step(self) -> int | None:
        """The newest kept checkpoint a fork can go on from (below max_steps), if any."""
        usable = [step for step in self.kept_steps if self.start_step <= step < self.max_steps]
        return max(usable) if usable else None


@dataclass(frozen=True)
class PbtDecision:
    """The judgement of one run at one step, and for an exploit what it takes."""

    run_id: str
    step: int
    value: float | None
    rank: int | None
    of: int
    decision: Decision
    reached_at: float
    bottom_cutoff: float | None = None  # the best value still in the bottom quantile
    source: str | None = None  # exploit: the run whose checkpoint it takes
    source_step: int | None = None
    source_value: float | None = None
    new_run: str | None = None  # exploit: the id of the fork that goes on in its place
    changes: dict[str, list[Any]] = field(default_factory=dict)  # key -> [source's, new]

    def reason(self, metric: str, mode: str) -> str:
        """`pbt step 10: eval_reward_mean 0.61, rank 4/4 (bottom 1): run_b@10 (0.82) goes
        on as run_a-pbt1 with lr 0.003 -> 0.0024`."""
        head = f"pbt step {self.step}: {metric}"
        shown = "no value" if self.value is None else f"{self.value:.4g}"
        standing = f"rank {self.rank}/{self.of}" if self.rank is not None else f"of {self.of}"
        if self.decision == "exploit":
            source_value = "?" if self.source_value is None else f"{self.source_value:.4g}"
            changes = ", ".join(
                f"{key} {show_value(old)} -> {show_value(new)}"
                for key, (old, new) in self.changes.items()
            )
            return (
                f"{head} {shown}, {standing}, in the bottom quantile: {self.source}@"
                f"{self.source_step} ({metric} {source_value}) goes on as {self.new_run}"
                + (f" with {changes}" if changes else "")
            )
        why = {
            "continue": "goes on",
            "too_few": "too few runs to rank, goes on",
            "no_value": "no value at this step, not judged",
            "no_source": "in the bottom quantile, but no top run keeps a checkpoint to take; "
            "goes on",
        }[self.decision]
        return f"{head} {shown}, {standing}: {why}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PbtDecision:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})


# ---------------------------------------------------------------- where a run stands


def reached(member: Member, step: int) -> MetricPoint | None:
    """The record with which `member` reached `step`: its first at or past it."""
    for point in member.points:
        if point.step >= step:
            return point
    return None


def latest_before(member: Member, when: float) -> float | None:
    """The member's latest value recorded at or before `when` (unix seconds)."""
    latest = None
    for point in member.points:
        if point.time <= when:
            latest = point.value
    return latest


def bottom_and_top(n: int, quantile: float) -> int:
    """How many runs each quantile holds among `n` (Ray's rule: ceil, at most half)."""
    return min(math.ceil(n * quantile), n // 2)


# ---------------------------------------------------------------- perturbing


def perturbed(
    settings: Mapping[str, Any], params: Mapping[str, Param], spec: PbtSpec, rng: random.Random
) -> dict[str, list[Any]]:
    """key -> [source's value, new value] for each key of `params` (those PBT perturbs): a
    float multiplied by one of `factors`, or (with `resample_probability`, and always for
    other values) drawn afresh from the key's `[sweep]` values or distribution."""
    changes: dict[str, list[Any]] = {}
    for key, param in params.items():
        old = settings.get(key)
        is_float = isinstance(old, float)
        if is_float and rng.random() >= spec.resample_probability:
            new: Any = float(f"{old * rng.choice(spec.factors):.{SIGNIFICANT_DIGITS}g}")
        elif param.distribution is not None:
            new = draw_value(param, rng.random(), 0)
        else:
            new = rng.choice(param.values)
        changes[key] = [old, new]
    return changes


def next_run_id(loser: str, taken: Iterable[str]) -> str:
    """The fork's id: the member's name with its generation, `run_a` -> `run_a-pbt1`,
    `run_a-pbt1` -> `run_a-pbt2` (the next one free)."""
    match = GENERATION.match(loser)
    member, generation = (match["member"], int(match["generation"])) if match else (loser, 0)
    taken = set(taken)
    while True:
        generation += 1
        suffix = f"-pbt{generation}"
        candidate = member[: MAX_RUN_ID_CHARS - len(suffix)] + suffix
        if candidate not in taken:
            return candidate


# ---------------------------------------------------------------- deciding


def decide(
    decided: Sequence[PbtDecision],
    members: Sequence[Member],
    spec: PbtSpec,
    params: Mapping[str, Param],
    seed: int | str = 0,
) -> list[PbtDecision]:
    """The new decisions that `members` call for, in the order the runs reached their
    steps; `decided` are the decisions so far (never revisited)."""
    done = {(d.run_id, d.step) for d in decided}
    exploited = {d.run_id for d in decided if d.decision == "exploit"}
    taken = {m.run_id for m in members} | {d.new_run for d in decided if d.new_run}
    pending: list[tuple[float, str, int, MetricPoint]] = []
    for member in members:
        if not member.in_race or member.run_id in exploited:
            continue
        for step in spec.judged_steps(member.max_steps, member.start_step):
            if (member.run_id, step) in done:
                continue
            point = reached(member, step)
            if point is None:
                break  # steps are reached in order
            pending.append((point.time, member.run_id, step, point))
    pending.sort(key=lambda item: (item[0], item[1], item[2]))

    by_id = {member.run_id: member for member in members}
    new: list[PbtDecision] = []
    for _, run_id, step, point in pending:
        if run_id in exploited:
            continue  # it exploited at an earlier step in this same pass
        result = _judge(by_id[run_id], step, point, by_id, exploited, spec, params, seed, taken)
        new.append(result)
        if result.decision == "exploit":
            exploited.add(run_id)
            assert result.new_run is not None
            taken.add(result.new_run)
    return new


def _judge(
    member: Member,
    step: int,
    point: MetricPoint,
    members: Mapping[str, Member],
    exploited: set[str],
    spec: PbtSpec,
    params: Mapping[str, Param],
    seed: int | str,
    taken: set[str],
) -> PbtDecision:
    when, value = point.time, point.value
    if not math.isfinite(value):
        return PbtDecision(member.run_id, step, None, None, 0, "no_value", when)
    population: dict[str, float] = {member.run_id: value}
    for other in members.values():
        if other.run_id == member.run_id or not other.in_race or other.run_id in exploited:
            continue
        latest = latest_before(other, when)
        if latest is not None and math.isfinite(latest):
            population[other.run_id] = latest
    n = len(population)
    rank = 1 + sum(1 for v in population.values() if _better(v, value, spec.mode))
    base = PbtDecision(member.run_id, step, value, rank, n, "continue", when)
    if n < spec.min_runs:
        return _with(base, decision="too_few")
    k = bottom_and_top(n, spec.quantile)
    ordered = sorted(population.values(), reverse=spec.mode == "max")
    cutoff = ordered[n - k]  # the best value of the bottom k
    base = _with(base, bottom_cutoff=cutoff)
    if rank <= n - k:
        return base
    top = [
        run_id
        for run_id, v in sorted(population.items())
        if run_id != member.run_id
        and 1 + sum(1 for o in population.values() if _better(o, v, spec.mode)) <= k
        and members[run_id].fork_step() is not None
    ]
    if not top:
        return _with(base, decision="no_source")
    rng = random.Random(f"{seed}/pbt/{member.run_id}/{step}")
    source = members[rng.choice(top)]
    changes = perturbed(source.settings, params, spec, rng)
    return _with(
        base,
        decision="exploit",
        source=source.run_id,
        source_step=source.fork_step(),
        source_value=population[source.run_id],
        new_run=next_run_id(member.run_id, taken),
        changes=changes,
    )


def _with(base: PbtDecision, **changes: Any) -> PbtDecision:
    return PbtDecision(**{**asdict(base), **changes})


def _better(a: float, b: float, mode: str) -> bool:
    return a > b if mode == "max" else a < b


# ---------------------------------------------------------------- lineage


def lineage(run_id: str, forked_from: Mapping[str, tuple[str, int] | None]) -> list[str]:
    """`run_id`'s line back to a run that started afresh: `["run_a-pbt2", "run_b@20",
    "run_c@10"]`: after the run itself, the source each was forked from at its step (run_a-pbt2
    from run_b's step 20, run_b from run_c's step 10; run_c started afresh). `forked_from`
    maps each run to (source, step), or None."""
    return [run_id] + [f"{source}@{step}" for source, step in lineage_sources(run_id, forked_from)]


def lineage_sources(
    run_id: str, forked_from: Mapping[str, tuple[str, int] | None]
) -> list[tuple[str, int]]:
    """The (source, step) pairs `run_id` descends from, nearest first, until a run that
    started afresh, one that is not in `forked_from`, or a loop written by hand."""
    sources: list[tuple[str, int]] = []
    seen = {run_id}
    current = forked_from.get(run_id)
    while current is not None:
        sources.append(current)
        source = current[0]
        if source in seen:
            break  # a loop: stop rather than go round
        seen.add(source)
        current = forked_from.get(source)
    return sources
