"""`workbench trace`: where an experiment's time went, as a timeline Perfetto opens (a track
per process, a span per activity: `workbench.files.trace`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from workbench.commands.alerts import parse_since
from workbench.commands.common import (
    EXIT_BAD_INPUT,
    ExperimentArg,
    experiment_or_fail,
    fail,
    say,
)
from workbench.files import layout
from workbench.files.trace import chrome_trace, experiment_spans


def trace(
    output: Annotated[
        Path,
        typer.Option("--output", "-o", help="The trace file to write (JSON).", show_default=False),
    ],
    experiment: ExperimentArg = None,
    since: Annotated[
        str | None,
        typer.Option(
            help="Only the time since then: a duration back from now (30s, 10m, 2h, 1d) or "
            "a time (2026-12-07T10:00).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Write where an experiment's time went as a Chrome trace: open it in
    https://ui.perfetto.dev or chrome://tracing.

    One track per process: vLLM (inference: generating while any run waits on a generation
    or an eval), the trainer (update, publishing adapters, waiting for rollouts; its adapter
    writes on threads of their own) and each run's orchestrator (generation, scoring and
    writing, loading adapter, waiting for adapter or eval; its evals on a thread of their
    own). Every process records its spans in the experiment's spans/ while it runs; a
    running experiment's trace reaches its last second.
    """
    try:
        cutoff = parse_since(since, time.time()) if since is not None else None
    except ValueError as err:
        raise fail(str(err), EXIT_BAD_INPUT) from None
    path = experiment_or_fail(experiment)
    processes = experiment_spans(path, cutoff)
    if not processes:
        raise fail(
            f"no spans in {layout.spans_dir(path)}"
            + (f" since {since}" if since else "")
            + ": the trainer and the orchestrators record them while they run"
        )
    document = chrome_trace(processes, str(path))
    try:
        output.write_text(json.dumps(document), encoding="utf-8")
    except OSError as err:
        raise fail(f"cannot write {output}: {err}") from None
    count = sum(len(spans) for spans in processes.values())
    first = min(s.start for spans in processes.values() for s in spans)
    last = max(s.end for spans in processes.values() for s in spans)
    say(
        f"wrote {output}: {count} spans of {len(processes)} processes over "
        f"{last - first:.0f} s; open it in https://ui.perfetto.dev"
    )
