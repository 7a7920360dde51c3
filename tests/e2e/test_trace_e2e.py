"""`workbench trace` end to end, with every real part (vLLM's CPU build, the torchrun
trainer, two orchestrators, the supervisor, the built-in tiny model): after a short
experiment the trace is a Chrome trace Perfetto opens (the JSON object format, checked field
by field: Perfetto's trace processor fetches a binary from the internet, which this machine
cannot reach), every process is a track of its own, and each process's spans cover its
life as its busy record knows it, within 3 %."""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from pathlib import Path

import pytest

from tests.e2e.cli import workbench
from workbench.files import busy, layout

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.slow


RECIPE = """\
[experiment]
name = "trace"
output_dir = "outputs/trace"
[model]
base = "builtin:tiny-reverse"
[inference]
max_loras = 4
[trainer]
max_concurrent_runs = 2
[defaults]
env_args = { min_length = 5, max_length = 5 }
max_steps = 4
batch_size = 16
rollouts_per_prompt = 4
eval = { interval = 2, num_prompts = 8 }
[[runs]]
id = "a"
[[runs]]
id = "b"
lr = 1e-3
"""


def check_schema(document: dict) -> dict[int, str]:
    """The fields Perfetto's JSON importer reads; returns the process name of each pid."""
    assert isinstance(document["traceEvents"], list)
    names: dict[int, str] = {}
    for event in document["traceEvents"]:
        assert event["ph"] in ("X", "M"), event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int), event
        assert isinstance(event["name"], str) and event["name"], event
        if event["ph"] == "M":
            if event["name"] == "process_name":
                names[event["pid"]] = event["args"]["name"]
            continue
        assert isinstance(event["ts"], int | float) and event["ts"] >= 0, event
        assert isinstance(event["dur"], int | float) and event["dur"] > 0, event
    return names


def main_lines(document: dict) -> dict[int, list[tuple[float, float, str]]]:
    lines = defaultdict(list)
    for event in document["traceEvents"]:
        if event["ph"] == "X" and event["tid"] == 1:
            lines[event["pid"]].append((event["ts"], event["ts"] + event["dur"], event["name"]))
    return {pid: sorted(spans) for pid, spans in lines.items()}


def test_the_trace_of_a_short_experiment_has_every_process_and_covers_its_time(tmp_path: Path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)
    experiment = tmp_path / "outputs" / "trace"
    try:
        result = workbench("up", str(recipe), "--headless", cwd=tmp_path, timeout=12 * 60)
    finally:
        if (experiment / "supervisor").exists():
            workbench("down", str(experiment), cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    out = tmp_path / "trace.json"
    written = workbench("trace", str(experiment), "-o", str(out), cwd=tmp_path)
    assert written.returncode == 0, written.stdout + written.stderr
    document = json.loads(out.read_text())
    names = check_schema(document)
    assert sorted(names.values()) == ["inference", "run_a", "run_b", "trainer"]

    origin = document["otherData"]["origin_unix_s"]
    lines = main_lines(document)
    labels = {names[pid]: {name for _, _, name in spans} for pid, spans in lines.items()}
    assert {"generation", "scoring and writing", "loading adapter"} <= labels["run_a"]
    assert {"update", "publishing adapters", "waiting for rollouts"} <= labels["trainer"]
    assert labels["inference"] == {"generation", "waiting for requests"}
    threads = {(names[e["pid"]], e["name"]) for e in document["traceEvents"] if e["ph"] == "X"} - {
        (names[pid], name) for pid, spans in lines.items() for _, _, name in spans
    }
    assert ("trainer", "writing adapter") in threads and ("run_a", "eval") in threads

    records = busy.BusyReader(experiment).records()
    for pid, spans in lines.items():
        covered = sum(end - start for start, end, _ in spans)
        wall = spans[-1][1] - spans[0][0]
        assert covered / wall == pytest.approx(1.0, abs=0.03), names[pid]
        record = records.get(names[pid])
        if record is not None:  # the track spans the process's life, start to last write
            life = (record.written_at - record.started_at) * 1e6
            assert covered / life == pytest.approx(1.0, abs=0.03), names[pid]
            assert spans[0][0] / 1e6 + origin == pytest.approx(record.started_at, abs=0.5)
    assert (layout.spans_dir(experiment) / "trainer.jsonl").stat().st_size > 0

    later = (dt.datetime.now() + dt.timedelta(hours=1)).isoformat(timespec="seconds")
    since = workbench("trace", str(experiment), "-o", str(out), "--since", later, cwd=tmp_path)
    assert since.returncode == 1 and "no spans" in since.stderr, since.stderr
