"""The lifecycle of one supervised process: its states, the events that move it, the table.

Pure: no processes, no clock, no I/O. `Lifecycle.handle(event, now, reason)` looks up the
row of `TRANSITIONS` for (state, event), moves to the row's state, does the row's
bookkeeping and returns the actions its owner carries out on the OS process. Every state
has a row for every event, a move or a refusal; a refused pair raises `Refused`.

The states are named here (`ProcessState`), and so is the supervisor's own status
(`SupervisorStatus`); their values are the words state.json holds.

An exit is one of six events, which `Lifecycle.exited(facts, now)` picks in this order:
the stop was asked for a restart (exit_restart); the supervisor is shutting down or asked
for the stop (exit_stopped); the run holds its orchestrator: evicted, deleted, rejected
(exit_held); the run is finished (exit_done); then the restart policy: a permanent
failure (exit_failed), an exit the policy does not restart (exit_done or exit_failed), a
spent restart budget (exit_failed), else a restart after a backoff delay (exit_backoff).

The table (`describe_transitions()` writes it; a test keeps this copy true):

    event              in state                         becomes   and
    start              waiting backoff                  waiting   release, fresh budget
                       exited failed stopped            waiting   release, fresh budget
                       starting ready running           stopping  release, terminate, then start
                       stopping                         stopping  release, then start
    spawned            waiting backoff                  starting
                       other states: refused (only a process waiting to start is spawned)
    spawned_unchecked  waiting backoff                  running
                       other states: refused (only a process waiting to start is spawned)
    spawn_failed       waiting backoff                  failed
                       other states: refused (only a process waiting to start is spawned)
    blocked            waiting                          waiting
                       backoff                          backoff   keep reason
                       other states: refused (only a process waiting to start waits for others)
    ready              starting                         ready     keep reason
                       other states: refused (only a starting process awaits its readiness check)
    ready_timeout      starting                         stopping  release, terminate, then fail
                       other states: refused (only a starting process awaits its readiness check)
    stop               starting ready running           stopping  release, terminate, then stop
                       stopping                         stopping  keep reason
                       waiting backoff                  stopped   release
                       exited failed stopped            (same)    keep reason
    hold               starting ready running           stopping  hold, terminate, then stop
                       stopping                         stopping  hold, then stop
                       waiting backoff                  stopped   hold
                       exited failed stopped            (same)    hold
    exit_restart       stopping                         waiting   fresh budget
                       other states: refused (only a stop asked for a restart ends in one)
    exit_stopped       starting ready running stopping  stopped   keep reason
                       other states: refused (no OS process runs to exit)
    exit_held          starting ready running stopping  stopped   hold
                       other states: refused (no OS process runs to exit)
    exit_done          starting ready running stopping  exited
                       other states: refused (no OS process runs to exit)
    exit_failed        starting ready running stopping  failed
                       other states: refused (no OS process runs to exit)
    exit_backoff       starting ready running stopping  backoff   backoff
                       other states: refused (no OS process runs to exit)

Actions: `terminate` is the owner's (SIGTERM to the process group now, SIGKILL after its
stop timeout); the others are bookkeeping done here. `release` / `hold`: whether its
run's condition keeps it down (discovery starts a held process again once that clears).
`fresh budget`: no failures counted, start as soon as what it needs is ready. `then
start` / `then stop` / `then fail`: what its exit leads to (a stop for a readiness
timeout counts as a failed attempt). `backoff`: count the failure, start again after the
policy's delay. Unless a row keeps it, the reason becomes the event's (None clears it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from workbench.supervisor.policy import RestartPolicy


class ProcessState(StrEnum):
    """The state of one supervised process; its value is what state.json says."""

    WAITING = "waiting"  # not started yet: waiting for a process it needs to be ready
    STARTING = "starting"  # spawned; its readiness check has not passed yet
    READY = "ready"  # spawned and its readiness check passed
    RUNNING = "running"  # spawned; it has no readiness check
    BACKOFF = "backoff"  # exited with a failure; restarts when its backoff delay ends
    STOPPING = "stopping"  # SIGTERM sent to its group; SIGKILL follows after the stop timeout
    EXITED = "exited"  # exited by itself and will not be restarted (a clean exit: done)
    FAILED = "failed"  # gave up: restarts exhausted, or it could not be started at all
    STOPPED = "stopped"  # stopped by the supervisor (down, eviction, deleted run, ...)


PROCESS_STATES = tuple(ProcessState)
# Spawned and not asked to stop.
STARTED_STATES = frozenset({ProcessState.STARTING, ProcessState.READY, ProcessState.RUNNING})
# An OS process exists: it has a pid and an uptime.
LIVE_STATES = STARTED_STATES | {ProcessState.STOPPING}
# Usable by the processes that wait for it.
UP_STATES = frozenset({ProcessState.READY, ProcessState.RUNNING})
# Down, and nothing starts it again but a new start (discovery, `workbench restart`).
TERMINAL_STATES = frozenset({ProcessState.EXITED, ProcessState.FAILED, ProcessState.STOPPED})
# Down, and started again once due.
WAITING_STATES = (ProcessState.WAITING, ProcessState.BACKOFF)
# Not up yet, on its way to be: what the supervisor waits out before it is running.
COMING_UP_STATES = frozenset({ProcessState.WAITING, ProcessState.STARTING})


class SupervisorStatus(StrEnum):
    """The supervisor's own status (state.json's `status`): starting until every process
    of the plan has come up or given up, running, then stopping (orchestrators first, then
    the plan's processes in reverse) and stopped."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


# The supervisor stops, or is stopping: it takes no more requests.
SHUTDOWN_STATUSES = frozenset({SupervisorStatus.STOPPING, SupervisorStatus.STOPPED})


class Event(StrEnum):
    START = "start"  # (re)start with a fresh budget: discovery, `workbench restart`
    SPAWNED = "spawned"  # the OS process started; a readiness check follows
    SPAWNED_UNCHECKED = "spawned_unchecked"  # the OS process started; it has no check
    SPAWN_FAILED = "spawn_failed"  # it could not be started at all
    BLOCKED = "blocked"  # due to start, but a process it needs is not ready
    READY = "ready"  # its readiness check passed
    READY_TIMEOUT = "ready_timeout"  # its readiness check did not pass in time
    STOP = "stop"  # the supervisor is shutting down
    HOLD = "hold"  # its run is evicted, deleted or rejected: down until that clears
    EXIT_RESTART = "exit_restart"
    EXIT_STOPPED = "exit_stopped"
    EXIT_HELD = "exit_held"
    EXIT_DONE = "exit_done"
    EXIT_FAILED = "exit_failed"
    EXIT_BACKOFF = "exit_backoff"


# Actions. TERMINATE is the owner's; the others are done by `Lifecycle` itself.
TERMINATE = "terminate"
RELEASE = "release"
HOLD = "hold"
FRESH_BUDGET = "fresh budget"
THEN_START = "then start"
THEN_STOP = "then stop"
THEN_FAIL = "then fail"
BACKOFF = "backoff"
KEEP_REASON = "keep reason"
OWNER_ACTIONS = frozenset({TERMINATE})
_AFTER_EXIT = (THEN_START, THEN_STOP, THEN_FAIL)
SAME = None  # a row's target: the state does not change


@dataclass(frozen=True)
class Move:
    """In `states`, `event` leads to `target` (SAME: stays) and the row's `actions`."""

    event: Event
    states: tuple[ProcessState, ...]
    target: ProcessState | None
    actions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """In `states`, `event` cannot happen; `why` says what can."""

    event: Event
    states: tuple[ProcessState, ...]
    why: str


class Refused(Exception):
    """An event the table refuses in the process's current state."""


_STARTED = (ProcessState.STARTING, ProcessState.READY, ProcessState.RUNNING)
_LIVE = (*_STARTED, ProcessState.STOPPING)
_ENDED = (ProcessState.EXITED, ProcessState.FAILED, ProcessState.STOPPED)
_STARTING = (ProcessState.STARTING,)
_STOPPING = (ProcessState.STOPPING,)


def _rest(*taken: tuple[ProcessState, ...]) -> tuple[ProcessState, ...]:
    used = {state for states in taken for state in states}
    return tuple(state for state in PROCESS_STATES if state not in used)


_ONLY_WAITING = "only a process waiting to start is spawned"
_ONLY_STARTING = "only a starting process awaits its readiness check"
_NO_PROCESS = "no OS process runs to exit"

TRANSITIONS: tuple[Move | Refusal, ...] = (
    Move(Event.START, WAITING_STATES, ProcessState.WAITING, (RELEASE, FRESH_BUDGET)),
    Move(Event.START, _ENDED, ProcessState.WAITING, (RELEASE, FRESH_BUDGET)),
    Move(Event.START, _STARTED, ProcessState.STOPPING, (RELEASE, TERMINATE, THEN_START)),
    Move(Event.START, _STOPPING, ProcessState.STOPPING, (RELEASE, THEN_START)),
    Move(Event.SPAWNED, WAITING_STATES, ProcessState.STARTING),
    Refusal(Event.SPAWNED, _rest(WAITING_STATES), _ONLY_WAITING),
    Move(Event.SPAWNED_UNCHECKED, WAITING_STATES, ProcessState.RUNNING),
    Refusal(Event.SPAWNED_UNCHECKED, _rest(WAITING_STATES), _ONLY_WAITING),
    Move(Event.SPAWN_FAILED, WAITING_STATES, ProcessState.FAILED),
    Refusal(Event.SPAWN_FAILED, _rest(WAITING_STATES), _ONLY_WAITING),
    Move(Event.BLOCKED, (ProcessState.WAITING,), ProcessState.WAITING),
    # A process in backoff keeps saying why it failed and when it restarts.
    Move(Event.BLOCKED, (ProcessState.BACKOFF,), ProcessState.BACKOFF, (KEEP_REASON,)),
    Refusal(
        Event.BLOCKED, _rest(WAITING_STATES), "only a process waiting to start waits for others"
    ),
    Move(Event.READY, _STARTING, ProcessState.READY, (KEEP_REASON,)),
    Refusal(Event.READY, _rest(_STARTING), _ONLY_STARTING),
    Move(Event.READY_TIMEOUT, _STARTING, ProcessState.STOPPING, (RELEASE, TERMINATE, THEN_FAIL)),
    Refusal(Event.READY_TIMEOUT, _rest(_STARTING), _ONLY_STARTING),
    Move(Event.STOP, _STARTED, ProcessState.STOPPING, (RELEASE, TERMINATE, THEN_STOP)),
    # Already on its way down: a stop for a restart still restarts (and is stopped then).
    Move(Event.STOP, _STOPPING, ProcessState.STOPPING, (KEEP_REASON,)),
    Move(Event.STOP, WAITING_STATES, ProcessState.STOPPED, (RELEASE,)),
    Move(Event.STOP, _ENDED, SAME, (KEEP_REASON,)),
    Move(Event.HOLD, _STARTED, ProcessState.STOPPING, (HOLD, TERMINATE, THEN_STOP)),
    Move(Event.HOLD, _STOPPING, ProcessState.STOPPING, (HOLD, THEN_STOP)),
    Move(Event.HOLD, WAITING_STATES, ProcessState.STOPPED, (HOLD,)),
    # It stays as it ended; only a held `stopped` process is started again by discovery.
    Move(Event.HOLD, _ENDED, SAME, (HOLD,)),
    Move(Event.EXIT_RESTART, _STOPPING, ProcessState.WAITING, (FRESH_BUDGET,)),
    Refusal(Event.EXIT_RESTART, _rest(_STOPPING), "only a stop asked for a restart ends in one"),
    Move(Event.EXIT_STOPPED, _LIVE, ProcessState.STOPPED, (KEEP_REASON,)),
    Refusal(Event.EXIT_STOPPED, _rest(_LIVE), _NO_PROCESS),
    Move(Event.EXIT_HELD, _LIVE, ProcessState.STOPPED, (HOLD,)),
    Refusal(Event.EXIT_HELD, _rest(_LIVE), _NO_PROCESS),
    Move(Event.EXIT_DONE, _LIVE, ProcessState.EXITED),
    Refusal(Event.EXIT_DONE, _rest(_LIVE), _NO_PROCESS),
    Move(Event.EXIT_FAILED, _LIVE, ProcessState.FAILED),
    Refusal(Event.EXIT_FAILED, _rest(_LIVE), _NO_PROCESS),
    Move(Event.EXIT_BACKOFF, _LIVE, ProcessState.BACKOFF, (BACKOFF,)),
    Refusal(Event.EXIT_BACKOFF, _rest(_LIVE), _NO_PROCESS),
)


def reaction(state: ProcessState, event: Event) -> Move | Refusal:
    """The row of `TRANSITIONS` for `event` in `state`."""
    for row in TRANSITIONS:
        if row.event == event and state in row.states:
            return row
    raise KeyError(f"the lifecycle table has no row for {event} in state {state!r}")


def describe_transitions() -> str:
    """The table as the module docstring shows it."""
    lines = [f"{'event':<17}  {'in state':<31}  {'becomes':<8}  and"]
    for event in Event:
        label = str(event)
        for row in TRANSITIONS:
            if row.event != event:
                continue
            if isinstance(row, Refusal):
                lines.append(f"{'':<17}  other states: refused ({row.why})")
                continue
            target = "(same)" if row.target is SAME else row.target
            states = " ".join(row.states)
            actions = ", ".join(row.actions)
            lines.append(f"{label:<17}  {states:<31}  {target:<8}  {actions}")
            label = ""
    return "\n".join(line.rstrip() for line in lines)


@dataclass(frozen=True)
class ExitFacts:
    """What the owner knows when the OS process has ended."""

    description: str  # how it ended: "exit code 1", "killed by SIGKILL", an error
    clean: bool  # exit code 0
    code: int | None
    uptime_s: float
    shutting_down: bool = False  # the supervisor is stopping everything
    run_hold: str | None = None  # why its run may not run now (orchestrators)
    run_finished: bool = False
    cause: str | None = None  # what its log says ended it (vLLM's engine error)


class Lifecycle:
    """The state of one supervised process and the bookkeeping that goes with it.

    `reason` says why it is in its state (shown by `workbench status` and the TUI); `held`
    says whether its run's condition keeps it down; `next_start_at` is when a waiting or
    backoff process is due (monotonic seconds).
    """

    def __init__(self, policy: RestartPolicy, log_path: Path):
        self.policy = policy
        self.log_path = log_path
        self.state = ProcessState.WAITING
        self.reason: str | None = None
        self.held = False
        self.consecutive_failures = 0
        # The causes of the consecutive failures so far (None where the log named none).
        self.failure_causes: list[str | None] = []
        self.next_start_at = 0.0
        self._after_exit: str | None = None
        self._backoff: tuple[int, float] | None = None

    def _same_cause_note(self) -> str:
        """`: the same error ended all 4 starts, ...` when every failure in a row had one
        cause: a deterministic failure that restarts will not fix."""
        causes = self.failure_causes
        if len(causes) < 2 or causes[0] is None or len(set(causes)) != 1:
            return ""
        return f": the same error ended all {len(causes)} starts, so restarting will not fix it"

    def due(self, now: float) -> bool:
        """Whether it waits to start and its time has come."""
        return self.state in WAITING_STATES and now >= self.next_start_at

    def handle(self, event: Event, now: float, reason: str | None = None) -> tuple[str, ...]:
        """Move on `event`; return the actions left to the owner (`TERMINATE`)."""
        row = reaction(self.state, event)
        if isinstance(row, Refusal):
            raise Refused(f"{event} in state {self.state}: refused ({row.why})")
        if row.target is not SAME:
            self.state = row.target
        if KEEP_REASON not in row.actions:
            self.reason = reason
        for action in row.actions:
            if action == RELEASE:
                self.held = False
            elif action == HOLD:
                self.held = True
            elif action == FRESH_BUDGET:
                self.consecutive_failures = 0
                self.next_start_at = now
            elif action in _AFTER_EXIT:
                self._after_exit = action
            elif action == BACKOFF:
                assert self._backoff is not None
                self.consecutive_failures, delay = self._backoff
                self.next_start_at = now + delay
        return tuple(action for action in row.actions if action in OWNER_ACTIONS)

    def exited(self, facts: ExitFacts, now: float) -> Event:
        """Move on the exit of the OS process; return which exit it was."""
        event, reason = self._exit_event(facts)
        self._after_exit = None
        self.handle(event, now, reason)
        self._backoff = None
        return event

    def _exit_event(self, facts: ExitFacts) -> tuple[Event, str | None]:
        after = self._after_exit
        if after == THEN_START:
            return Event.EXIT_RESTART, None
        if facts.shutting_down or after == THEN_STOP:
            return Event.EXIT_STOPPED, None
        if facts.run_hold is not None:
            return Event.EXIT_HELD, facts.run_hold
        if facts.run_finished:
            return Event.EXIT_DONE, "run finished"
        ok = facts.clean and after != THEN_FAIL
        policy = self.policy
        if not ok and policy.is_permanent(facts.code):
            return Event.EXIT_FAILED, (
                f"{facts.description}: a failure that a restart cannot fix; see {self.log_path}"
            )
        if not policy.wants_restart(ok):
            if ok:
                return Event.EXIT_DONE, None
            return Event.EXIT_FAILED, f"{facts.description}; restart policy is {policy.mode}"
        # A process that stayed up long enough starts a fresh count of failures.
        stable = facts.uptime_s >= policy.stable_after_s
        failures = 1 if stable else self.consecutive_failures + 1
        self.failure_causes = [*self.failure_causes[: failures - 1], facts.cause]
        delay = policy.delay_before_restart(failures)
        if delay is None:
            return Event.EXIT_FAILED, (
                f"{facts.description}; gave up after {policy.max_restarts} restarts"
                f"{self._same_cause_note()} (see {self.log_path})"
            )
        self._backoff = (failures, delay)
        return Event.EXIT_BACKOFF, (
            f"{facts.description}; restart {failures} of {policy.max_restarts} in {delay:.1f}s"
        )
