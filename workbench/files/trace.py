"""An experiment's spans as one timeline: a track per process, in the Chrome trace format.

Each recording process's spans (`spans/<process>.jsonl`) are completed from its busy record
(`busy/<process>.json`: the activities ended since the last append, and the one under way
until the record was written), so a trace of a running experiment reaches its last second.
vLLM keeps no record: its track (`inference`) is seen from the orchestrators' requests, as
the busy shares see it: generating while any orchestrator waits on a generation or an eval,
else waiting for requests.

`chrome_trace` writes the JSON object format that Perfetto (ui.perfetto.dev) and
chrome://tracing open: "X" (complete) events with `ts` and `dur` in microseconds from the
trace's first span, `pid` a process and `tid` its main line (1) or one of its threads, and
"M" events naming each process and thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.files import busy, layout
from workbench.files.spans import MAIN, Span, read_experiment_spans

EVAL = "eval"  # the thread of an orchestrator's evals: vLLM's work too


def experiment_spans(experiment: Path, since: float | None = None) -> dict[str, list[Span]]:
    """Every process's spans, oldest first, each clipped to start at `since` at the earliest;
    `inference` derived from the orchestrators'."""
    processes = read_experiment_spans(experiment, since)
    for name, record in busy.BusyReader(experiment).records().items():
        processes[name] = _completed(processes.get(name, []), record)
    orchestrators = [spans for name, spans in processes.items() if layout.is_run_dir_name(name)]
    inference = inference_spans([s for spans in orchestrators for s in spans])
    if inference:
        processes[busy.INFERENCE] = inference
    if since is not None:
        processes = {name: clipped(spans, since) for name, spans in processes.items()}
    return {name: spans for name, spans in processes.items() if spans}


def _completed(spans: list[Span], record: busy.BusyRecord) -> list[Span]:
    """`spans` and the activities of `record` after the last one appended (a process appends
    at most once a second), the current one up to the record's last write."""
    main_end = max((s.end for s in spans if s.thread == MAIN), default=0.0)
    newer = [
        Span(i.label, i.kind, i.start, i.end)
        for i in record.intervals_until(record.written_at)
        if i.start >= main_end - 1e-6 and i.end > i.start
    ]
    return sorted([*spans, *newer], key=lambda s: s.start)


def inference_spans(orchestrator_spans: list[Span]) -> list[Span]:
    """vLLM's track: the union of the orchestrators' generations and evals, the gaps between
    them waiting, from the first orchestrator span to the last."""
    if not orchestrator_spans:
        return []
    requests = sorted(
        (s for s in orchestrator_spans if s.label == busy.GENERATION or s.thread == EVAL),
        key=lambda s: s.start,
    )
    start = min(s.start for s in orchestrator_spans)
    end = max(s.end for s in orchestrator_spans)
    track, reach = [], start
    for request in requests:
        if request.start > reach:
            track.append(Span("waiting for requests", busy.WAITING, reach, request.start))
        if request.end > reach:
            track.append(Span(busy.GENERATION, busy.BUSY, max(reach, request.start), request.end))
            reach = request.end
    if end > reach:
        track.append(Span("waiting for requests", busy.WAITING, reach, end))
    return _merged(track)


def _merged(track: list[Span]) -> list[Span]:
    """Touching spans of one label as one."""
    merged: list[Span] = []
    for span in track:
        last = merged[-1] if merged else None
        if last is not None and last.label == span.label and span.start - last.end < 1e-6:
            merged[-1] = Span(last.label, last.kind, last.start, span.end, last.thread)
        else:
            merged.append(span)
    return merged


def clipped(spans: list[Span], since: float) -> list[Span]:
    return [
        Span(s.label, s.kind, max(s.start, since), s.end, s.thread) for s in spans if s.end > since
    ]


def _order(name: str) -> tuple[int, str]:
    """vLLM first, then the trainer, then the runs by name."""
    rank = {busy.INFERENCE: 0, "trainer": 1}.get(name, 2)
    return rank, name


def chrome_trace(processes: dict[str, list[Span]], experiment: str = "") -> dict[str, Any]:
    """The Chrome trace (JSON object format) of `processes`' spans."""
    starts = [s.start for spans in processes.values() for s in spans]
    origin = min(starts, default=0.0)
    events: list[dict[str, Any]] = []
    for pid, name in enumerate(sorted(processes, key=_order), start=1):
        spans = processes[name]
        threads = [MAIN, *sorted({s.thread for s in spans} - {MAIN})]
        events.append(_meta("process_name", pid, 0, name=name))
        events.append(_meta("process_sort_index", pid, 0, sort_index=pid))
        for tid, thread in enumerate(threads, start=1):
            events.append(_meta("thread_name", pid, tid, name=thread or "activity"))
        tids = {thread: tid for tid, thread in enumerate(threads, start=1)}
        for span in spans:
            events.append(
                {
                    "name": span.label,
                    "cat": span.kind,
                    "ph": "X",
                    "ts": round((span.start - origin) * 1e6, 1),
                    "dur": round(span.seconds * 1e6, 1),
                    "pid": pid,
                    "tid": tids[span.thread],
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"experiment": experiment, "origin_unix_s": origin},
    }


def _meta(kind: str, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}
