"""The lifecycle table of a supervised process, and the exits it tells apart (no processes)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from workbench.supervisor import lifecycle
from workbench.supervisor.lifecycle import (
    PROCESS_STATES,
    TERMINATE,
    TRANSITIONS,
    Event,
    ExitFacts,
    Lifecycle,
    Move,
    Refusal,
    Refused,
    describe_transitions,
    reaction,
)
from workbench.supervisor.policy import RestartPolicy

EXIT_EVENTS = {event for event in Event if event.startswith("exit_")}
KNOWN_ACTIONS = {
    lifecycle.TERMINATE,
    lifecycle.RELEASE,
    lifecycle.HOLD,
    lifecycle.FRESH_BUDGET,
    lifecycle.THEN_START,
    lifecycle.THEN_STOP,
    lifecycle.THEN_FAIL,
    lifecycle.BACKOFF,
    lifecycle.KEEP_REASON,
}
POLICY = RestartPolicy(max_restarts=2, backoff_initial_s=1.0, stable_after_s=60.0)


def crash(uptime_s: float = 1.0, **facts) -> ExitFacts:
    return ExitFacts(description="exit code 1", clean=False, code=1, uptime_s=uptime_s, **facts)


def running(policy: RestartPolicy = POLICY) -> Lifecycle:
    machine = Lifecycle(policy, Path("logs/p.log"))
    machine.handle(Event.SPAWNED_UNCHECKED, 0.0)
    return machine


@pytest.mark.parametrize("event", list(Event))
def test_every_state_has_exactly_one_reaction_or_refusal_to_every_event(event):
    for state in PROCESS_STATES:
        rows = [row for row in TRANSITIONS if row.event == event and state in row.states]
        assert len(rows) == 1, f"{event} in {state}: {len(rows)} rows"


def test_rows_name_only_known_states_and_actions():
    for row in TRANSITIONS:
        assert set(row.states) <= set(PROCESS_STATES), row
        if isinstance(row, Move):
            assert row.target is None or row.target in PROCESS_STATES, row
            assert set(row.actions) <= KNOWN_ACTIONS, row
        else:
            assert row.why, row


def test_the_module_docstring_shows_the_table_as_it_is():
    documented = inspect.getdoc(lifecycle)
    table = "\n".join(f"    {line}" for line in describe_transitions().splitlines())
    assert table in documented


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (row_state, row.event)
        for row in TRANSITIONS
        if isinstance(row, Move) and row.event not in EXIT_EVENTS
        for row_state in row.states
    ],
)
def test_each_move_of_the_table_is_what_handle_does(state, event):
    machine = Lifecycle(POLICY, Path("logs/p.log"))
    machine.state = state
    row = reaction(state, event)
    owner_actions = machine.handle(event, 5.0, "why")
    assert machine.state == (state if row.target is None else row.target)
    assert owner_actions == ((TERMINATE,) if TERMINATE in row.actions else ())
    if lifecycle.KEEP_REASON not in row.actions:
        assert machine.reason == "why"


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (row_state, row.event)
        for row in TRANSITIONS
        if isinstance(row, Refusal)
        for row_state in row.states
    ],
)
def test_a_refused_event_raises_and_changes_nothing(state, event):
    machine = Lifecycle(POLICY, Path("logs/p.log"))
    machine.state = state
    with pytest.raises(Refused, match=str(event)):
        machine.handle(event, 5.0, "why")
    assert machine.state == state and machine.reason is None


def test_a_crash_backs_off_then_fails_once_the_restart_budget_is_spent():
    machine = running()
    assert machine.exited(crash(), 10.0) == Event.EXIT_BACKOFF
    assert machine.state == "backoff" and machine.next_start_at == 11.0
    assert machine.reason == "exit code 1; restart 1 of 2 in 1.0s"
    assert not machine.due(10.5) and machine.due(11.0)
    machine.handle(Event.SPAWNED_UNCHECKED, 11.0)
    assert machine.exited(crash(), 12.0) == Event.EXIT_BACKOFF
    assert machine.reason == "exit code 1; restart 2 of 2 in 2.0s"
    machine.handle(Event.SPAWNED_UNCHECKED, 14.0)
    assert machine.exited(crash(), 15.0) == Event.EXIT_FAILED
    assert machine.state == "failed" and "gave up after 2 restarts" in machine.reason


@pytest.mark.parametrize(
    ("causes", "says_same"),
    [
        (["engine died: E", "engine died: E", "engine died: E"], True),
        (["engine died: E", "engine died: F", "engine died: E"], False),
        ([None, None, None], False),
    ],
)
def test_giving_up_says_when_the_same_error_ended_every_start(causes, says_same):
    machine = running()
    for start, cause in enumerate(causes):
        if start:
            machine.handle(Event.SPAWNED_UNCHECKED, 100.0 * start)
        machine.exited(crash(cause=cause), 100.0 * start + 1)
    assert machine.state == "failed" and "gave up after 2 restarts" in machine.reason
    assert ("the same error ended all 3 starts" in machine.reason) == says_same


def test_a_crash_after_a_stable_run_starts_a_fresh_count():
    machine = running()
    machine.exited(crash(), 1.0)
    machine.handle(Event.SPAWNED_UNCHECKED, 2.0)
    machine.exited(crash(uptime_s=600.0), 602.0)
    assert machine.reason == "exit code 1; restart 1 of 2 in 1.0s"


def test_a_permanent_exit_code_fails_at_once():
    machine = running(RestartPolicy(permanent_exit_codes=(2,)))
    facts = ExitFacts(description="exit code 2", clean=False, code=2, uptime_s=1.0)
    assert machine.exited(facts, 1.0) == Event.EXIT_FAILED
    assert "a failure that a restart cannot fix" in machine.reason


def test_a_clean_exit_that_the_policy_does_not_restart_is_done():
    machine = running()
    facts = ExitFacts(description="exit code 0", clean=True, code=0, uptime_s=1.0)
    assert machine.exited(facts, 1.0) == Event.EXIT_DONE
    assert machine.state == "exited" and machine.reason is None


def test_an_exit_of_a_finished_run_is_done_whatever_the_code():
    machine = running()
    assert machine.exited(crash(run_finished=True), 1.0) == Event.EXIT_DONE
    assert (machine.state, machine.reason) == ("exited", "run finished")


def test_a_hold_stops_the_process_keeps_it_down_and_a_start_releases_it():
    machine = running()
    assert machine.handle(Event.HOLD, 1.0, "evicted: diverged") == (TERMINATE,)
    assert (machine.state, machine.held) == ("stopping", True)
    assert machine.exited(crash(), 2.0) == Event.EXIT_STOPPED
    assert (machine.state, machine.reason, machine.held) == ("stopped", "evicted: diverged", True)
    machine.handle(Event.START, 3.0)
    assert (machine.state, machine.held, machine.reason) == ("waiting", False, None)
    assert machine.due(3.0)


def test_an_exit_of_a_run_that_is_evicted_meanwhile_holds_it():
    machine = running()
    assert machine.exited(crash(run_hold="evicted: by itself"), 1.0) == Event.EXIT_HELD
    assert (machine.state, machine.reason, machine.held) == ("stopped", "evicted: by itself", True)


def test_a_restart_stops_the_process_and_its_exit_queues_a_start_with_a_fresh_budget():
    machine = running()
    machine.exited(crash(), 1.0)
    machine.handle(Event.SPAWNED_UNCHECKED, 2.0)
    assert machine.handle(Event.START, 3.0, "restarting: requested") == (TERMINATE,)
    assert machine.state == "stopping"
    assert machine.exited(crash(), 4.0) == Event.EXIT_RESTART
    assert (machine.state, machine.consecutive_failures, machine.next_start_at) == (
        "waiting",
        0,
        4.0,
    )


def test_a_readiness_timeout_counts_as_a_failed_attempt():
    machine = Lifecycle(POLICY, Path("logs/p.log"))
    machine.handle(Event.SPAWNED, 0.0)
    assert machine.handle(Event.READY_TIMEOUT, 9.0, "not ready after 9s") == (TERMINATE,)
    terminated = ExitFacts(description="killed by SIGTERM", clean=False, code=None, uptime_s=9.0)
    assert machine.exited(terminated, 10.0) == Event.EXIT_BACKOFF


def test_while_shutting_down_every_exit_is_a_stop():
    machine = running()
    assert machine.exited(crash(shutting_down=True, run_hold="deleted"), 1.0) == (
        Event.EXIT_STOPPED
    )
    assert machine.state == "stopped"


def test_a_shutdown_leaves_a_pending_restart_to_happen_and_then_stops_it():
    machine = running()
    machine.handle(Event.START, 1.0, "restarting: requested")
    machine.handle(Event.STOP, 2.0, "supervisor stopping")
    assert machine.exited(crash(shutting_down=True), 3.0) == Event.EXIT_RESTART
    machine.handle(Event.STOP, 3.0, "supervisor stopping")
    assert (machine.state, machine.reason) == ("stopped", "supervisor stopping")


def test_a_blocked_backoff_keeps_saying_when_it_restarts():
    machine = running()
    machine.exited(crash(), 1.0)
    reason = machine.reason
    machine.handle(Event.BLOCKED, 5.0, "waiting for inference to be ready")
    assert (machine.state, machine.reason) == ("backoff", reason)
