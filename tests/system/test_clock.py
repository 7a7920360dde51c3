"""Time as files and people read it: one timestamp format, one way to write a duration."""

from __future__ import annotations

import datetime as dt

import pytest

from workbench.system.clock import format_duration, format_elapsed, now_iso, unix_time


def test_timestamps_are_utc_to_the_millisecond():
    stamp = now_iso()
    parsed = dt.datetime.fromisoformat(stamp)
    assert parsed.utcoffset() == dt.timedelta(0) and stamp.endswith("+00:00")
    assert len(stamp.split("T")[1].split("+")[0]) == len("20:00:00.123")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0, "0s"),
        (42.9, "42s"),
        (420, "7m"),
        (11_100, "3h05m"),
        (200_000, "2d07h"),
        (5_000_000, "57d"),
    ],
)
def test_durations_are_coarse_and_short(seconds, text):
    assert format_duration(seconds) == text
    assert len(format_duration(seconds)) <= 6


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, "-"), (-1, "0s"), (86.7, "86s"), (599, "599s"), (720, "12m")]
)
def test_a_watched_wait_counts_seconds_up_to_ten_minutes(seconds, text):
    assert format_elapsed(seconds) == text


def test_unix_time_reads_the_iso_stamps_the_files_hold_and_unix_numbers():
    assert unix_time("2026-01-01T00:00:00+00:00") == 1767225600.0
    assert unix_time("2026-01-01T00:00:00.250+00:00") == 1767225600.25
    assert unix_time(12.5) == 12.5
    assert unix_time("yesterday") is None
    assert unix_time(None) is None
    assert unix_time(True) is None
