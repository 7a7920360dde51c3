"""Requests that screens send up to the app, which owns the supervisor link and the files.

Screens and widgets say what the user asked for; the app decides how (a dialog first, a
file written, a command sent). Nothing below the app talks to the supervisor.
"""

from __future__ import annotations

from textual.message import Message


class EvictRun(Message):
    """Ask for a reason, then evict `run_id`."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id


class RestartRun(Message):
    """Restart a run: clear its eviction, resume from its last checkpoint (the supervisor)."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id


class RestartProcess(Message):
    """Restart one supervised process (`inference`, `trainer` or an orchestrator)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name


class AddRun(Message):
    """Ask for an id and overrides, then have the supervisor create the run."""


class StopAll(Message):
    """Confirm, then have the supervisor stop every process gracefully."""


class ShowRun(Message):
    """Open the detail screen of `run_id`."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id


class ShowSamples(Message):
    """Open the rollout browser of `run_id`: its recent steps' prompts and completions."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id


class ShowCurves(Message):
    """Open the curves screen: every run's reward or eval curve on one chart."""


class ShowAlerts(Message):
    """Open the alerts screen: every alert the supervisor raised, newest first."""


class ShowLeaderboard(Message):
    """Open the leaderboard: every run ranked by the sweep's metric."""


class SwitchRanking(Message):
    """Rank the leaderboard by the other of its rankings: the metric's last record, or the
    asymptote of its sigmoid fit."""
