"""Restart policy: exponential backoff, a budget of consecutive restarts, permanent failures."""

from __future__ import annotations

from workbench.supervisor.policy import RestartPolicy


def test_backoff_doubles_from_the_initial_delay_up_to_the_cap():
    policy = RestartPolicy(backoff_initial_s=1.0, backoff_factor=2.0, backoff_max_s=5.0)
    assert [policy.backoff_s(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_restarts_stop_once_max_restarts_consecutive_failures_are_spent():
    policy = RestartPolicy(max_restarts=2, backoff_initial_s=0.5)
    assert policy.delay_before_restart(1) == 0.5
    assert policy.delay_before_restart(2) == 1.0
    assert policy.delay_before_restart(3) is None


def test_on_failure_restarts_only_failures_always_restarts_clean_exits_never_restarts_nothing():
    assert RestartPolicy(mode="on-failure").wants_restart(exit_ok=False)
    assert not RestartPolicy(mode="on-failure").wants_restart(exit_ok=True)
    assert RestartPolicy(mode="always").wants_restart(exit_ok=True)
    assert not RestartPolicy(mode="never").wants_restart(exit_ok=False)


def test_permanent_exit_codes_are_recognised():
    policy = RestartPolicy(permanent_exit_codes=(2, 3))
    assert policy.is_permanent(2) and policy.is_permanent(3)
    assert not policy.is_permanent(1) and not policy.is_permanent(None)
