"""`workbench.files.busy`: where a process's time goes, as shares of a window, and its file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import age_files, make_run
from tests.orchestrator.scripted import ScriptedChat, make_orchestrator, publish_adapter
from workbench.files import busy, layout
from workbench.files.busy import BUSY, STARTING, WAITING, BusyReader, Interval, Recorder


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_shares_are_the_fractions_of_the_window_each_kind_and_activity_covers():
    intervals = [
        Interval("starting", STARTING, 0, 10),
        Interval("update", BUSY, 10, 40),
        Interval("waiting for rollouts", WAITING, 40, 100),
    ]
    assert busy.shares(intervals, 0, 100) == {STARTING: 0.1, BUSY: 0.3, WAITING: 0.6}
    # Only the part inside the window counts.
    assert busy.shares(intervals, 20, 60) == {BUSY: 0.5, WAITING: 0.5}
    by_label = busy.shares(intervals, 0, 100, by="label")
    assert by_label == {"starting": 0.1, "update": 0.3, "waiting for rollouts": 0.6}
    assert busy.shares(intervals, 50, 50) == {}


def test_overlapping_requests_cover_the_server_once():
    a = [Interval("generation", BUSY, 0, 30), Interval("generation", BUSY, 50, 60)]
    b = [Interval("generation", BUSY, 20, 40)]
    assert busy.covered_share([*a, *b], 0, 100) == pytest.approx(0.5)
    assert busy.covered_share(b, 30, 40) == 1.0
    assert busy.covered_share([], 0, 10) == 0.0


def test_a_process_is_starting_until_ready_and_marks_nest(tmp_path: Path):
    clock = Clock(1000.0)
    recorder = Recorder(tmp_path / "p.json", "run_a", started_at=990.0, clock=clock)
    recorder.ready("scoring and writing", BUSY)  # at 1000: ten seconds of starting
    clock.now = 1002.0
    recorder.push("waiting for adapter", WAITING)
    clock.now = 1005.0
    recorder.push("loading adapter", BUSY)
    clock.now = 1006.0
    recorder.pop()  # back to waiting
    clock.now = 1008.0
    recorder.pop()  # back to scoring
    clock.now = 1010.0
    record = recorder.snapshot()
    assert [(i.label, i.start, i.end) for i in record.intervals] == [
        ("starting", 990.0, 1000.0),
        ("scoring and writing", 1000.0, 1002.0),
        ("waiting for adapter", 1002.0, 1005.0),
        ("loading adapter", 1005.0, 1006.0),
        ("waiting for adapter", 1006.0, 1008.0),
    ]
    assert (record.current.label, record.current.start) == ("scoring and writing", 1008.0)
    assert record.totals == {
        "starting": (STARTING, 10.0),
        "scoring and writing": (BUSY, 4.0),
        "waiting for adapter": (WAITING, 5.0),
        "loading adapter": (BUSY, 1.0),
    }
    whole = busy.whole_run_summary(record)
    assert (whole[STARTING], whole[BUSY], whole[WAITING]) == (0.5, 0.25, 0.25)


def test_the_record_keeps_only_the_window_but_totals_the_whole_life(tmp_path: Path):
    clock = Clock(0.0)
    recorder = Recorder(tmp_path / "p.json", "trainer", started_at=0.0, window_s=60, clock=clock)
    recorder.ready("waiting for rollouts", WAITING)
    for second in range(0, 300, 10):
        clock.now = second + 5.0
        recorder.push("update", BUSY)
        clock.now = second + 10.0
        recorder.pop()
    record = recorder.snapshot()
    assert all(interval.end >= 300 - 60 for interval in record.intervals)
    assert record.totals["update"] == (BUSY, 150.0)
    recent = busy.recent_summary(record, 300.0)
    assert (recent["window_s"], recent[BUSY], recent[WAITING]) == (60.0, 0.5, 0.5)


def test_the_file_round_trips_and_a_stopped_process_is_read_up_to_its_last_write(tmp_path):
    clock = Clock(100.0)
    experiment = tmp_path
    path = layout.busy_path(experiment, "trainer")
    recorder = Recorder(path, "trainer", started_at=90.0, clock=clock)
    recorder.ready("waiting for rollouts", WAITING)
    clock.now = 110.0
    recorder.push("update", BUSY)
    clock.now = 120.0
    recorder.flush()
    record = busy.read_record(path)
    assert record == recorder.snapshot()
    # Written by a process that is gone (no such pid): shares end at its last write.
    dead = busy.BusyRecord(**{**record.__dict__, "pid": 2**22 + 1})
    busy.write_record(path, dead)
    recent = BusyReader(experiment).recent(now=10_000.0)["trainer"]
    assert recent["window_s"] == 30.0
    assert recent["activities"] == {
        "starting": 0.333,
        "update": 0.333,
        "waiting for rollouts": 0.333,
    }
    assert busy.read_record(tmp_path / "missing.json") is None


def test_inference_is_busy_while_any_orchestrator_waits_on_a_generation(tmp_path: Path):
    for run_id, (start, end) in {"run_a": (100.0, 120.0), "run_b": (110.0, 130.0)}.items():
        clock = Clock(100.0)
        recorder = Recorder(
            layout.busy_path(tmp_path, run_id), run_id, started_at=100.0, clock=clock
        )
        recorder.ready("scoring and writing", BUSY)
        clock.now = start
        recorder.push(busy.GENERATION, BUSY)
        clock.now = end
        recorder.pop()
        clock.now = 140.0
        record = recorder.snapshot()
        busy.write_record(recorder.path, busy.BusyRecord(**{**record.__dict__, "pid": None}))
    recent = BusyReader(tmp_path).recent(now=10_000.0)
    assert recent[busy.INFERENCE][BUSY] == 0.75  # 100-130 of 100-140
    assert recent["run_a"]["activities"][busy.GENERATION] == 0.5


def test_an_orchestrator_step_records_its_waits_and_its_generation(experiment: Path, monkeypatch):
    run = make_run(experiment, "run_a")
    recorder = Recorder(layout.busy_path(experiment, "run_a"), "run_a", started_at=0.0)
    monkeypatch.setattr(busy, "_recorder", recorder)
    orchestrator = make_orchestrator(run, ScriptedChat())
    busy.ready("scoring and writing")
    orchestrator.step_once()
    publish_adapter(run, 1)
    orchestrator.step_once()
    recorder.flush()
    record = busy.read_record(layout.busy_path(experiment, "run_a"))
    assert record is not None and record.pid == os.getpid()
    labels = {label for label in record.totals}
    assert {"starting", "scoring and writing", busy.GENERATION, "waiting for adapter"} <= labels
    assert "loading adapter" in labels  # step 1 loaded the adapter of step 1


def test_an_ended_processs_shares_are_summed_once_while_its_file_stays(tmp_path, monkeypatch):
    # The TUI asks every second; a sweep leaves hundreds of finished orchestrators.
    for run_id in ("run_a", "run_b"):
        path = layout.busy_path(tmp_path, run_id)
        recorder = Recorder(path, run_id, started_at=100.0, clock=Clock(100.0))
        recorder.ready(busy.GENERATION, BUSY)
        record = recorder.snapshot()
        busy.write_record(recorder.path, busy.BusyRecord(**{**record.__dict__, "pid": None}))
    age_files(tmp_path)  # settled: a file changed within the clock's tick is read again
    summed = []
    real = busy.recent_summary
    monkeypatch.setattr(
        busy,
        "recent_summary",
        lambda record, end: summed.append(record.process) or real(record, end),
    )
    reader = BusyReader(tmp_path)
    first = reader.recent(now=10_000.0)
    assert reader.recent(now=10_001.0) == first
    assert sorted(summed) == ["run_a", "run_b"]
