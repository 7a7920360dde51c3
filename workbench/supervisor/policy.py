"""When a supervised process that exited is started again: restart on failure with backoff.

Pure logic, no processes: the supervisor asks `delay_before_restart` after each failure and
either waits that long or gives up (state `failed`). A process that stayed up for
`stable_after_s` before failing starts a fresh count, so one crash a day never adds up to
`max_restarts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RestartMode = Literal["on-failure", "always", "never"]


@dataclass(frozen=True)
class RestartPolicy:
    """How a supervised process is restarted.

    mode: `on-failure` restarts after a non-zero exit or a signal; `always` also after a
    clean exit; `never` records the exit and leaves the process down.
    max_restarts: consecutive restarts allowed before the process is marked `failed`.
    backoff_initial_s, backoff_factor, backoff_max_s: the n-th consecutive restart waits
    `min(backoff_max_s, backoff_initial_s * backoff_factor ** (n - 1))` seconds.
    stable_after_s: a run at least this long resets the consecutive-failure count.
    permanent_exit_codes: exit codes by which a process says that starting it again cannot
        help (a bad config, vLLM not installed); it is marked `failed` at once.
    """

    mode: RestartMode = "on-failure"
    max_restarts: int = 5
    backoff_initial_s: float = 1.0
    backoff_factor: float = 2.0
    backoff_max_s: float = 30.0
    stable_after_s: float = 60.0
    permanent_exit_codes: tuple[int, ...] = ()

    def wants_restart(self, exit_ok: bool) -> bool:
        """Whether this kind of exit calls for a restart at all (the budget aside)."""
        if self.mode == "never":
            return False
        return self.mode == "always" or not exit_ok

    def is_permanent(self, exit_code: int | None) -> bool:
        return exit_code is not None and exit_code in self.permanent_exit_codes

    def backoff_s(self, restart_number: int) -> float:
        """Seconds to wait before the `restart_number`-th consecutive restart (1-based)."""
        exponent = max(restart_number - 1, 0)
        return min(self.backoff_max_s, self.backoff_initial_s * self.backoff_factor**exponent)

    def delay_before_restart(self, consecutive_failures: int) -> float | None:
        """Seconds to wait before restarting after the `consecutive_failures`-th failure in a
        row, or None when the budget of `max_restarts` is spent."""
        if consecutive_failures > self.max_restarts:
            return None
        return self.backoff_s(consecutive_failures)
