"""`workbench.files.spans` and `workbench.files.trace`: every activity a process ended kept
as a span (appended with its busy record, bounded), and an experiment's spans as a Chrome
trace with a track per process that covers its time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.files import busy, layout, spans, trace
from workbench.files.busy import BUSY, WAITING, Recorder
from workbench.files.spans import Span, SpanLog


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def record_process(experiment: Path, process: str, marks, started_at: float = 990.0) -> float:
    """A recorder of `process` that goes through `marks` ((seconds, "push"/"pop"/"ready", label,
    kind)), then flushes 3 s later; returns the clock at the end."""
    clock = Clock(started_at + 10)
    recorder = Recorder(
        layout.busy_path(experiment, process),
        process,
        started_at=started_at,
        clock=clock,
        span_log=SpanLog(layout.spans_path(experiment, process)),
    )
    for seconds, what, label, kind in marks:
        clock.now += seconds
        if what == "ready":
            recorder.ready(label, kind)
        elif what == "push":
            recorder.push(label, kind)
        else:
            recorder.pop()
    clock.now += 3.0  # the last activity goes on until the flush
    recorder.flush()
    return clock.now


ORCHESTRATOR = [
    (0, "ready", "scoring and writing", BUSY),
    (1, "push", "waiting for adapter", WAITING),
    (2, "push", "loading adapter", BUSY),
    (1, "pop", "", ""),
    (1, "pop", "", ""),
    (0, "push", "generation", BUSY),
    (5, "pop", "", ""),
    (2, "push", "generation", BUSY),
]


def test_every_ended_activity_is_appended_as_a_span_and_the_trace_adds_the_current_one(
    tmp_path: Path,
):
    end = record_process(tmp_path, "run_a", ORCHESTRATOR)
    logged = spans.read_spans(layout.spans_path(tmp_path, "run_a"))
    assert [(s.label, s.start, s.end) for s in logged] == [
        ("starting", 990.0, 1000.0),
        ("scoring and writing", 1000.0, 1001.0),
        ("waiting for adapter", 1001.0, 1003.0),
        ("loading adapter", 1003.0, 1004.0),
        ("waiting for adapter", 1004.0, 1005.0),
        ("generation", 1005.0, 1010.0),
        ("scoring and writing", 1010.0, 1012.0),
    ]
    # The generation under way is in the busy record only: the trace takes it from there.
    track = trace.experiment_spans(tmp_path)["run_a"]
    assert track[-1] == Span("generation", BUSY, 1012.0, end)
    assert sum(s.seconds for s in track) == pytest.approx(end - 990.0)


def test_a_log_past_its_cap_rotates_so_a_process_keeps_at_most_two_files(tmp_path: Path):
    path = tmp_path / "spans" / "trainer.jsonl"
    log = SpanLog(path, max_bytes=1000)
    for second in range(200):
        log.add(Span("update", BUSY, 1000.0 + second, 1000.5 + second))
        log.write()
    assert sorted(p.name for p in path.parent.iterdir()) == ["trainer.1.jsonl", "trainer.jsonl"]
    assert all(p.stat().st_size < 1100 for p in path.parent.iterdir())
    kept = spans.read_spans(path)
    assert kept[-1].start == 1199.0 and [s.start for s in kept] == sorted(s.start for s in kept)
    # A line cut short by a killed process is skipped, not an error.
    with path.open("a") as file:
        file.write('["update","busy",1300.0,')
    assert spans.read_spans(path)[-1].start == 1199.0


def test_threads_spans_go_to_lines_of_their_own(tmp_path: Path, monkeypatch):
    log = SpanLog(tmp_path / "spans" / "trainer.jsonl")
    monkeypatch.setattr(spans, "_log", log)
    with spans.span("writing adapter", thread="publish_0"):
        pass
    log.add(Span("update", BUSY, 1.0, 2.0))
    log.write()
    read = spans.read_spans(log.path)
    assert [(s.label, s.thread) for s in read][-1] == ("update", spans.MAIN)
    assert read[0].thread == "publish_0" and read[0].end >= read[0].start


def test_vllm_is_generating_while_any_orchestrator_waits_on_it():
    seen = [
        Span("scoring and writing", BUSY, 0.0, 2.0),
        Span("generation", BUSY, 2.0, 5.0),
        Span("generation", BUSY, 4.0, 6.0),
        Span("eval", BUSY, 5.5, 8.0, "eval"),
        Span("scoring and writing", BUSY, 8.0, 10.0),
    ]
    assert [(s.label, s.start, s.end) for s in trace.inference_spans(seen)] == [
        ("waiting for requests", 0.0, 2.0),
        ("generation", 2.0, 8.0),
        ("waiting for requests", 8.0, 10.0),
    ]


def test_the_chrome_trace_has_a_named_track_per_process_in_microseconds():
    document = trace.chrome_trace(
        {
            "run_a": [
                Span("generation", BUSY, 100.0, 101.5),
                Span("eval", BUSY, 100.5, 102, "eval"),
            ],
            "trainer": [Span("update", BUSY, 100.25, 101.0)],
            "inference": [Span("generation", BUSY, 100.0, 101.5)],
        }
    )
    events = document["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {1: "inference", 2: "trainer", 3: "run_a"}
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"
    }
    assert threads[(3, 1)] == "activity" and threads[(3, 2)] == "eval"
    update = next(e for e in events if e["name"] == "update")
    assert update == {
        "name": "update",
        "cat": BUSY,
        "ph": "X",
        "ts": 250000.0,
        "dur": 750000.0,
        "pid": 2,
        "tid": 1,
    }
    assert document["otherData"]["origin_unix_s"] == 100.0
    json.dumps(document)  # JSON as it is


def test_workbench_trace_writes_the_file_and_says_when_there_is_nothing(tmp_path: Path):
    experiment = tmp_path / "exp"
    layout.busy_dir(experiment).mkdir(parents=True)
    (experiment / "recipe.toml").write_text("")
    runner = CliRunner()
    out = tmp_path / "trace.json"
    empty = runner.invoke(app, ["trace", str(experiment), "-o", str(out)])
    assert empty.exit_code == 1 and "no spans in" in empty.output, empty.output
    bad = runner.invoke(app, ["trace", str(experiment), "-o", str(out), "--since", "soon"])
    assert bad.exit_code == 2 and "--since 'soon'" in bad.output, bad.output

    record_process(experiment, "run_a", ORCHESTRATOR)
    record_process(experiment, "trainer", [(0, "ready", "waiting for rollouts", WAITING)])
    written = runner.invoke(app, ["trace", str(experiment), "-o", str(out)])
    assert written.exit_code == 0, written.output
    events = json.loads(out.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert tracks == {"inference", "run_a", "trainer"}


def test_recording_spans_costs_little_per_mark(tmp_path: Path):
    """A mark is a push and a pop; with spans kept they also append to a list, and the
    file is written once a second at most."""
    import time

    recorder = Recorder(
        tmp_path / "busy.json",
        "run_a",
        started_at=time.time(),
        span_log=SpanLog(tmp_path / "spans.jsonl"),
    )
    started = time.perf_counter()
    for _ in range(2000):
        recorder.push("generation", BUSY)
        recorder.pop()
    per_mark = (time.perf_counter() - started) / 2000
    assert per_mark < 1e-3, per_mark
    assert busy.BUSY == BUSY
