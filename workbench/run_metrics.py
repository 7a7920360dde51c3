"""One run's metrics.jsonl, followed as it grows: what the TUI and `workbench status` show
of a run's rewards, evals and loss, read one way.

`MetricsReader` follows the file from the byte offset reached last time (the TUI polls it
every second; a file that shrinks or is replaced is read again from the start, never
whole at once): the orchestrator's batch rewards, the trainer's loss, tokens and trained
step, and the curves by step of the metrics it follows (`workbench.curves.MetricCurve`,
as `workbench plot` reads them). `latest_rewards` reads a run's file once, to its end, into
what the TUI's runs table and run detail show of it: the newest batch reward and the
newest held-out eval.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.curves import EVAL_METRIC, REWARD_METRIC, MetricCurve
from workbench.files import layout
from workbench.files.metrics import parse_record
from workbench.system.file_change import SETTLE_NS, Signature, settled, signature
from workbench.system.file_tail import AppendedLines

# Points of reward and loss history kept per run: enough for a chart as wide as a large
# terminal (two braille dots per cell) without growing for ever on a long run.
HISTORY_POINTS = 1000
# One poll reads at most this much of a metrics file, so a huge backlog is spread over a
# few polls instead of stalling one.
METRICS_READ_LIMIT = 4 * 1024 * 1024
# Every run's curves of these, by step: the curves screen draws them side by side, the run
# detail its eval curve.
FOLLOWED_CURVES = frozenset({REWARD_METRIC, EVAL_METRIC})
# How much of the end of a run's metrics.jsonl `latest_rewards` reads first: a few hundred
# steps of records, evals among them.
TAIL_BYTES = 256 * 1024


@dataclass(frozen=True)
class LossDiagnostics:
    """The run's loss at its latest update, from its trainer line: the kind, the share of
    loss tokens where its trust region acted, the importance ratio's mean and extremes, and
    the KL estimate to the base model where the run has that term."""

    kind: str
    clipped: float | None = None
    ratio_mean: float | None = None
    ratio_min: float | None = None
    ratio_max: float | None = None
    base_kl: float | None = None

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> LossDiagnostics | None:
        kind = record.get("loss_kind")
        if not isinstance(kind, str):
            return None  # a line from before loss kinds
        return cls(
            kind=kind,
            clipped=as_float(record.get("clipped")),
            ratio_mean=as_float(record.get("ratio_mean")),
            ratio_min=as_float(record.get("ratio_min")),
            ratio_max=as_float(record.get("ratio_max")),
            base_kl=as_float(record.get("base_kl")),
        )


class MetricsReader:
    """Follows one run's `metrics.jsonl`, remembering how far it has read.

    Orchestrator lines give the reward, trainer lines the loss, tokens and trained step;
    any line holding one of `curve_metrics` adds to that metric's curve (eval lines to
    `eval_reward_mean`'s). A line still being written (no newline yet) is kept back until
    it is complete; a file that is replaced is read again from its start. A file that
    did not change since it was read to its end is not opened again (`poll`).
    """

    def __init__(
        self,
        path: Path,
        history: int = HISTORY_POINTS,
        curve_metrics: frozenset[str] = FOLLOWED_CURVES,
        settle_ns: int = SETTLE_NS,
        initial_bytes: int | None = None,
    ) -> None:
        """`initial_bytes`: start that far from the file's end (its first, cut, line left
        out) rather than at its start."""
        self.path = path
        self._history = history
        self.curve_metrics = curve_metrics
        self._lines = AppendedLines(
            path, initial_bytes=initial_bytes, read_limit=METRICS_READ_LIMIT
        )
        self._path = str(path)
        self._settle_ns = settle_ns
        # The file's signature at the last read that reached its end, if settled then
        # (None: not there); False: read it next time.
        self._read_at: Signature | bool = False
        self.version = 0  # bumped whenever what the reader holds changed
        self.reads = 0  # times the file was opened: an unchanged one is not
        self._clear()

    def _clear(self) -> None:
        self.rewards: deque[float] = deque(maxlen=self._history)
        self.losses: deque[float] = deque(maxlen=self._history)
        self.trainer_step = 0
        self.last_step = 0  # of any line
        self.tokens = 0
        self.loss: LossDiagnostics | None = None
        self.last_time: float | None = None
        # One point per step that has the metric: as many as the run has steps, at most.
        self.curves = {metric: MetricCurve(metric) for metric in self.curve_metrics}

    @property
    def offset(self) -> int:
        return self._lines.offset or 0

    @property
    def caught_up(self) -> bool:
        """Whether the last read reached the file's end at a signature old enough to show
        the next change: until a file event says otherwise, there is nothing to read."""
        return self._read_at is not False

    def poll(self) -> bool:
        """Read what was appended since the last call; True if anything new was parsed.
        A file whose signature did not change since a read that got to its end is not
        opened (a `stat` is all it costs)."""
        current = signature(self._path)
        if current == self._read_at:
            return False
        self.reads += 1
        restarts = self._lines.restarts
        raw_lines = self._lines.read()
        at_end = current is None or self._lines.offset == current[1]
        trusted = settled((current,), time.time_ns(), self._settle_ns)
        self._read_at = current if at_end and trusted else False
        if self._lines.restarts != restarts:
            self._clear()
            self.version += 1
        parsed = False
        for raw in raw_lines:
            parsed |= self._consume(raw)
        if parsed:
            self.version += 1
        return parsed

    def read_to_end(self) -> None:
        """Read what the file holds now, in `poll`'s slices, for a reader used once
        (`latest_rewards`): the last slice is the one that moved no further."""
        while True:
            offset = self.offset
            self.poll()
            if self.caught_up or self.offset == offset:
                return

    def _consume(self, raw: bytes) -> bool:
        record = parse_record(raw)
        if record is None:
            return False  # a corrupt line is skipped, not fatal: the next one may be fine
        source = record.get("source")
        step = as_int(record.get("step"))
        if step is not None:
            self.last_step = max(self.last_step, step)
        for curve in self.curves.values():
            curve.add(record)
        if source == "orchestrator":
            reward = as_float(record.get("reward_mean"))
            if reward is not None:
                self.rewards.append(reward)
        elif source == "trainer":
            loss = as_float(record.get("loss"))
            if loss is not None:
                self.losses.append(loss)
            if step is not None:
                self.trainer_step = max(self.trainer_step, step)
            self.tokens += as_int(record.get("tokens")) or 0
            self.loss = LossDiagnostics.from_record(record) or self.loss
        when = as_float(record.get("time"))
        if when is not None:
            self.last_time = when if self.last_time is None else max(self.last_time, when)
        return True


@dataclass(frozen=True)
class LatestRewards:
    """What the TUI shows of a run's rewards beside its step: the mean reward of its newest
    training batch (the runs table's reward column) and its newest held-out eval, with the
    step it scored (the run detail's eval)."""

    reward: float | None = None
    eval_step: int | None = None
    eval_reward: float | None = None

    @classmethod
    def of(cls, reader: MetricsReader) -> LatestRewards:
        evals = reader.curves[EVAL_METRIC].points() if EVAL_METRIC in reader.curves else []
        eval_step, eval_reward = evals[-1] if evals else (None, None)
        return cls(
            reward=reader.rewards[-1] if reader.rewards else None,
            eval_step=eval_step,
            eval_reward=eval_reward,
        )

    def to_json(self) -> dict[str, Any]:
        """`reward`, and `eval`: null or {"step", "reward"}."""
        held_out = None
        if self.eval_step is not None:
            held_out = {"step": self.eval_step, "reward": self.eval_reward}
        return {"reward": self.reward, "eval": held_out}


def latest_rewards(run: Path, tail_bytes: int = TAIL_BYTES) -> LatestRewards:
    """`run`'s newest batch reward and held-out eval, read from the end of its
    metrics.jsonl as the TUI reads the file (no file yet: neither). Both are near the end
    of a run's file: the last `tail_bytes` are read, then 8 times more, ..., until both
    are found or the whole file was read (a run without evals)."""
    path = layout.metrics_path(run)
    window = tail_bytes
    while True:
        try:
            whole = path.stat().st_size <= window
        except FileNotFoundError:
            return LatestRewards()
        # One reward kept and only the eval curve followed: reading costs the parsing
        # of the lines read, not a history held in memory.
        reader = MetricsReader(
            path,
            history=1,
            curve_metrics=frozenset({EVAL_METRIC}),
            initial_bytes=None if whole else window,
        )
        reader.read_to_end()
        found = LatestRewards.of(reader)
        if whole or (found.reward is not None and found.eval_step is not None):
            return found
        window *= 8


# ---------------------------------------------------------------- small helpers


def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return None
