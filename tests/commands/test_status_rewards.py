"""`workbench status` shows each run's newest reward and held-out eval beside its step, as
the TUI shows them, and its table stays whole when piped."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import make_experiment, make_run
from workbench.cli import app
from workbench.files import layout, run_control
from workbench.files import tinker_work as tw
from workbench.files.metrics import append_metrics
from workbench.tui.data import ExperimentReader

EVICTED_WHY = "reward collapsed from 0.9 to 0.1 over 20 steps; try a lower lr in a new run"


@pytest.fixture
def experiment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Three runs of an experiment as `workbench up` makes it, their metrics.jsonl written
    by the writer the orchestrator, its evaluator and the trainer use: run_a trained four
    steps with evals at steps 2 and 4 (step 4's written before step 3's: the evaluator
    runs beside the loop), run_b one step and evicted, run_c nothing yet."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)  # rich would take it as the width
    experiment = make_experiment(
        tmp_path,
        "exp",
        "lr = 3e-3",
        '[[runs]]\nid = "a"\n\n[[runs]]\nid = "b"\n\n[[runs]]\nid = "c"\n',
    )
    run_a = layout.run_dir(experiment, "run_a")
    for step, reward in enumerate((0.5, 0.6, 0.7, 0.75), start=1):
        append_metrics(run_a, "orchestrator", step, reward_mean=reward, reward_std=0.1)
        append_metrics(run_a, "trainer", step, loss=0.1, tokens=100 * step)
    append_metrics(run_a, "eval", 4, eval_reward_mean=0.85, eval_samples=16)
    append_metrics(run_a, "eval", 2, eval_reward_mean=0.65, eval_samples=16)
    run_b = layout.run_dir(experiment, "run_b")
    append_metrics(run_b, "orchestrator", 1, reward_mean=0.25)
    run_control.write_eviction(run_b, EVICTED_WHY, by="user")
    return experiment


def status(*args: str):
    result = CliRunner().invoke(app, ["status", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_status_json_gives_each_runs_newest_reward_and_eval(experiment: Path):
    runs = {run["id"]: run for run in json.loads(status(str(experiment), "--json"))["runs"]}
    assert runs["run_a"]["reward"] == 0.75
    assert runs["run_a"]["eval"] == {"step": 4, "reward": 0.85}, "the newest step's eval"
    assert runs["run_b"]["reward"] == 0.25 and runs["run_b"]["eval"] is None
    assert runs["run_c"]["reward"] is None and runs["run_c"]["eval"] is None


def test_status_shows_the_reward_and_eval_the_tui_shows(experiment: Path):
    runs = {run["id"]: run for run in json.loads(status(str(experiment), "--json"))["runs"]}
    reader = ExperimentReader(experiment, supervisor_pid=lambda _: None)
    try:
        snapshot = reader.poll(rank=False)
    finally:
        reader.close()
    for view in snapshot.runs:
        held_out = {"step": view.evals[-1][0], "reward": view.evals[-1][1]} if view.evals else None
        assert (runs[view.id]["reward"], runs[view.id]["eval"]) == (view.reward, held_out)


def test_status_table_piped_has_one_whole_line_per_run(experiment: Path):
    """CliRunner's stdout is no terminal, as a pipe or a log file is: each run's row is
    one line with its reward, eval and whole reason, and no header is cut."""
    lines = status(str(experiment)).splitlines()
    header = next(line for line in lines if "run" in line and "status" in line)
    assert [cell.strip() for cell in header.strip("┃ ").split("┃")] == [
        "run", "status", "step", "slot", "reward", "eval", "reason",
    ]  # fmt: skip
    rows = {line.split("│")[1].strip(): line for line in lines if line.startswith("│")}
    assert set(rows) == {"run_a", "run_b", "run_c"}, "one line per run"
    cells = {run: [cell.strip() for cell in row.split("│")[1:-1]] for run, row in rows.items()}
    assert cells["run_a"][4:6] == ["0.750", "0.850 at 4"]
    assert cells["run_b"][4:] == ["0.250", "", EVICTED_WHY]
    assert cells["run_c"][4:] == ["", "", ""]


def test_the_newest_eval_is_found_however_far_back_it_was_written(tmp_path: Path):
    """`latest_rewards` reads the end of the file first and further back until it finds
    an eval, or reads the whole file of a run that has none: as one read of it all."""
    from workbench.run_metrics import LatestRewards, latest_rewards

    with_eval, without = tmp_path / "run_a", tmp_path / "run_b"
    for run in (with_eval, without):
        run.mkdir()
        for step in range(1, 60):
            append_metrics(run, "orchestrator", step, reward_mean=step / 100)
            append_metrics(run, "trainer", step, loss=0.1, tokens=100 * step)
            if run is with_eval and step == 1:  # its only eval, at the file's start
                append_metrics(run, "eval", 1, eval_reward_mean=0.61)
    append_metrics(with_eval, "orchestrator", 60, reward_mean=0.6)
    size = layout.metrics_path(with_eval).stat().st_size
    for tail_bytes in (200, 2_000, size + 1):
        assert latest_rewards(with_eval, tail_bytes) == LatestRewards(0.6, 1, 0.61)
        assert latest_rewards(without, tail_bytes) == LatestRewards(0.59, None, None)
    assert latest_rewards(tmp_path / "run_c") == LatestRewards()


def test_a_tinker_clients_run_shows_its_steps_unbounded_and_its_last_requests_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A run `workbench serve` made for a client: no max_steps (the client decides when it
    stops), and, in place of a reason, how long ago its client last sent work; the TUI's
    `updated` is that request when the trainer has logged nothing since."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)
    experiment = make_experiment(tmp_path, "exp", "lr = 3e-3", '[[runs]]\nid = "a"\n')
    run = make_run(experiment, "run_tinker_1", 'source = "tinker"\nseed = 0\n')
    tw.write_request(run, tw.WorkRequest(seq=0, op="optim_step", adam=tw.AdamParams()), {})
    sent = time.time() - 90
    os.utime(tw.work_dir(run), (sent, sent))

    runs = {row["id"]: row for row in json.loads(status(str(experiment), "--json"))["runs"]}
    assert runs["run_tinker_1"]["max_steps"] is None
    assert runs["run_tinker_1"]["last_request"] == pytest.approx(sent)
    assert runs["run_a"]["max_steps"] is not None and runs["run_a"]["last_request"] is None
    row = next(line for line in status(str(experiment)).splitlines() if "run_tinker_1" in line)
    cells = [cell.strip() for cell in row.split("│")[1:-1]]
    assert cells[2] == "0", "a step count without a bound"
    assert cells[-1] == "Tinker client, last request 1m ago", cells[-1]

    reader = ExperimentReader(experiment, supervisor_pid=lambda _: None)
    try:
        views = {view.id: view for view in reader.poll(rank=False).runs}
    finally:
        reader.close()
    assert views["run_tinker_1"].max_steps is None
    assert views["run_tinker_1"].last_update == pytest.approx(sent)
