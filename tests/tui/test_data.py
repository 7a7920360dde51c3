"""Reading the experiment directory: incremental, tolerant of absent and half-written files."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import age_files
from tests.tui.conftest import SUPERVISOR_PID
from tests.tui.synthetic import (
    FROZEN_NOW,
    append_metrics,
    build_experiment,
    build_sweep_experiment,
    eval_lines,
    make_run,
    metrics_lines,
)
from workbench.files import experiment_changes, layout
from workbench.sweep.report import build_report
from workbench.sweep.values import describe_values
from workbench.tui.commands import SupervisorCommands
from workbench.tui.data import ExperimentReader, MetricsReader
from workbench.tui.leaderboard import EARLY_STOPPED
from workbench.tui.screens.add_run import parse_add_run
from workbench.tui.tail import LogTail


def test_metrics_are_read_incrementally_from_the_last_offset(tmp_path):
    run = make_run(tmp_path, "run_a")
    append_metrics(run, metrics_lines(1, 4, reward0=0.2, slope=0.1))
    reader = MetricsReader(run / "metrics.jsonl")
    assert reader.poll()
    assert reader.rewards == pytest.approx([0.3, 0.4, 0.5])
    assert reader.trainer_step == 3
    assert reader.tokens == 3000
    offset = reader.offset
    assert offset == (run / "metrics.jsonl").stat().st_size

    assert not reader.poll(), "nothing new: nothing parsed"
    append_metrics(run, metrics_lines(4, 5, reward0=0.2, slope=0.1))
    assert reader.poll()
    assert reader.rewards == pytest.approx([0.3, 0.4, 0.5, 0.6])
    assert reader.offset > offset


def test_a_half_written_metrics_line_waits_for_its_newline(tmp_path):
    path = tmp_path / "metrics.jsonl"
    line = json.dumps({"source": "orchestrator", "step": 1, "time": 1.0, "reward_mean": 0.5})
    path.write_text(line[:10])
    reader = MetricsReader(path)
    assert not reader.poll()
    with open(path, "a") as handle:
        handle.write(line[10:] + "\n" + "not json\n")
    assert reader.poll()
    assert list(reader.rewards) == [0.5]


def test_a_replaced_metrics_file_is_read_from_its_start(tmp_path):
    run = make_run(tmp_path, "run_a")
    append_metrics(run, metrics_lines(1, 6, reward0=0.0, slope=0.1))
    reader = MetricsReader(run / "metrics.jsonl")
    reader.poll()
    (run / "metrics.jsonl").unlink()
    append_metrics(run, metrics_lines(1, 2, reward0=0.5, slope=0.0))
    reader.poll()
    assert list(reader.rewards) == [0.5]
    assert reader.trainer_step == 1


def test_a_missing_metrics_file_is_no_data(tmp_path):
    reader = MetricsReader(tmp_path / "run_a" / "metrics.jsonl")
    assert not reader.poll()
    assert reader.last_time is None


def test_snapshot_of_the_synthetic_experiment(tmp_path):
    experiment = build_experiment(tmp_path, supervisor_pid=SUPERVISOR_PID)
    snapshot = ExperimentReader(experiment, supervisor_pid=lambda _: SUPERVISOR_PID).poll()
    assert snapshot.supervisor.running
    fast = snapshot.run("run_lr1e-3")
    assert (fast.status, fast.step, fast.max_steps, fast.tokens) == ("active", 12, 30, 12000)
    assert fast.reward == pytest.approx(0.78)
    assert fast.last_update == FROZEN_NOW - 7.5
    assert snapshot.run("run_typo").status == "rejected"
    assert "max_step" in snapshot.run("run_typo").reason
    assert [p.name for p in snapshot.processes][:3] == ["supervisor", "inference", "trainer"]
    orchestrator = snapshot.process("run_lr1e-3")
    assert layout.process_log_path(experiment, orchestrator.name) == (
        experiment / "run_lr1e-3" / "logs" / "orchestrator.log"
    )
    assert layout.process_log_path(experiment, snapshot.process("trainer").name) == (
        experiment / "logs" / "trainer.log"
    )


def test_unchanged_directory_gives_an_equal_snapshot(tmp_path):
    # Equal snapshots are what lets the tables skip rows that did not change.
    experiment = build_experiment(tmp_path)
    reader = ExperimentReader(experiment)
    assert reader.poll() == reader.poll()


def test_a_dead_supervisor_is_shown_as_gone_without_pids(tmp_path):
    experiment = build_experiment(tmp_path, supervisor_pid=SUPERVISOR_PID)
    snapshot = ExperimentReader(experiment, supervisor_pid=lambda _: None).poll()
    assert not snapshot.supervisor.running
    assert snapshot.supervisor.status == "gone"
    trainer = snapshot.process("trainer")
    assert trainer.state == "running", "its last recorded state"
    assert trainer.pid is None and trainer.started_at is None, "no pid of a process maybe gone"


@pytest.mark.parametrize("content", [None, "", "{not json", "[1, 2]"])
def test_absent_or_broken_state_json_means_no_supervisor(tmp_path, content):
    experiment = build_experiment(tmp_path)
    state = experiment / "supervisor" / "state.json"
    state.unlink()
    if content is not None:
        state.write_text(content)
    snapshot = ExperimentReader(experiment, supervisor_pid=lambda _: None).poll()
    assert not snapshot.supervisor.running
    assert snapshot.processes == ()
    assert len(snapshot.runs) == 4


# ---------------------------------------------------------------- log tail


def test_log_tail_reads_only_the_end_of_a_big_file(tmp_path):
    path = tmp_path / "big.log"
    path.write_text("".join(f"line {i}\n" for i in range(100_000)))
    tail = LogTail(path, initial_bytes=1000)
    lines = tail.read_lines()
    assert lines[-1] == "line 99999"
    assert all(line.startswith("line ") for line in lines), "no partial first line"
    assert tail.bytes_read <= 1000
    assert tail.read_lines() == []


def test_log_tail_follows_truncation_and_cleans_terminal_codes(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("old 1\nold 2\n")
    tail = LogTail(path)
    assert tail.read_lines() == ["old 1", "old 2"]
    path.write_text("\x1b[31mred\x1b[0m\r\nprogress 10%\rprogress 100%\n")
    assert tail.read_lines() == ["red", "progress 100%"]
    assert tail.restarts == 1


# ---------------------------------------------------------------- add run dialog


def test_add_run_input_is_parsed_like_the_cli():
    request = parse_add_run(" lr1e-2 ", "lr=1e-2 sampling.temperature=0.5 env=reverse_text")
    assert request.run_id == "run_lr1e-2"
    assert request.overrides == {
        "lr": 0.01,
        "sampling": {"temperature": 0.5},
        "env": "reverse_text",
    }
    with pytest.raises(ValueError, match="may contain only"):
        parse_add_run("bad/id", "")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_add_run("ok", "lr")


# ---------------------------------------------------------------- commands


def test_commands_without_a_supervisor_say_so(tmp_path):
    outcome = SupervisorCommands(tmp_path).send("stop_all")
    assert not outcome.ok
    assert "supervisor" in outcome.message


def test_snapshot_reading_is_cheap_enough_to_repeat(tmp_path):
    # Not a timing test: polling twice reads no metrics bytes the second time.
    experiment = build_experiment(tmp_path)
    reader = ExperimentReader(experiment)
    reader.poll()
    offsets = {run_id: m.offset for run_id, m in reader._metrics.items()}
    reader.poll()
    assert offsets == {run_id: m.offset for run_id, m in reader._metrics.items()}
    assert os.path.getsize(experiment / "run_lr1e-3" / "metrics.jsonl") == offsets["run_lr1e-3"]
    assert isinstance(experiment, Path)


def test_eval_records_are_followed_incrementally_into_each_runs_eval_curve(tmp_path):
    experiment = build_sweep_experiment(tmp_path)
    reader = ExperimentReader(experiment, supervisor_pid=lambda _: SUPERVISOR_PID)
    run = reader.poll().run("run_lr1e-2_rank8")
    assert run.evals == ((0, 0.30), (5, 0.55), (10, 0.70))
    append_metrics(experiment / "run_lr1e-2_rank8", eval_lines([(15, 0.75), (10, 0.72)]))
    run = reader.poll().run("run_lr1e-2_rank8")
    # A step scored again (after a restart) keeps its latest value, as in the report.
    assert run.evals == ((0, 0.30), (5, 0.55), (10, 0.72), (15, 0.75))


def test_the_leaderboard_is_the_sweep_reports_ranking(tmp_path):
    experiment = build_sweep_experiment(tmp_path)
    reader = ExperimentReader(experiment, supervisor_pid=lambda _: SUPERVISOR_PID)
    board = reader.poll().leaderboard
    report = build_report(experiment)
    assert (board.metric, board.mode) == (report.metric, report.mode)
    assert [
        (row.rank, row.id, row.value, row.value_step, row.step, row.rung, row.rung_step)
        for row in board.rows
    ] == [
        (run.rank, run.id, run.value, run.eval_step, run.step, run.rung, run.rung_step)
        for run in report.runs
    ]
    assert [row.state == EARLY_STOPPED for row in board.rows] == [
        run.evicted_by_scheduler for run in report.runs
    ]
    assert [row.values for row in board.rows] == [
        describe_values(run.differences) for run in report.runs
    ]
    assert [row.curve for row in board.rows] == [
        tuple(value for _, value in run.evals) for run in report.runs
    ]


def test_the_leaderboard_ranks_by_the_recipes_early_stopping_metric(tmp_path):
    experiment = tmp_path / "exp"
    experiment.mkdir()
    (experiment / "recipe.toml").write_text(
        '[sweep.scheduler]\nkind = "asha"\nmetric = "loss"\nmode = "min"\n'
    )
    # Trainer lines hold the loss, 1 / (step + 1): run_b's last is the lowest.
    append_metrics(make_run(experiment, "run_a"), metrics_lines(1, 4, reward0=0.2, slope=0.1))
    append_metrics(make_run(experiment, "run_b"), metrics_lines(1, 7, reward0=0.2, slope=0.1))
    make_run(experiment, "run_c")
    reader = ExperimentReader(experiment, supervisor_pid=lambda _: None)
    board = reader.poll().leaderboard
    assert (board.metric, board.mode) == ("loss", "min")
    assert [(row.id, row.value) for row in board.rows] == [
        ("run_b", pytest.approx(1 / 7)),
        ("run_a", pytest.approx(1 / 4)),
        ("run_c", None),
    ]
    assert [row.id for row in board.rows] == [run.id for run in build_report(experiment).runs]


# ---------------------------------------------------------------- a poll costs what changed


def test_an_unchanged_metrics_file_is_not_opened_again(tmp_path):
    run = make_run(tmp_path, "run_a")
    append_metrics(run, metrics_lines(1, 4, reward0=0.2, slope=0.1))
    age_files(run)
    reader = MetricsReader(run / "metrics.jsonl")
    reader.poll()
    reader.poll()
    assert reader.reads == 1
    append_metrics(run, metrics_lines(4, 5, reward0=0.2, slope=0.1))
    assert reader.poll()
    assert reader.reads == 2
    assert reader.rewards == pytest.approx([0.3, 0.4, 0.5, 0.6])


def test_a_poll_reuses_the_rows_of_runs_that_did_not_change(tmp_path):
    experiment = build_experiment(tmp_path)
    age_files(experiment)
    reader = ExperimentReader(experiment, supervisor_pid=lambda _: SUPERVISOR_PID)
    before = {run.id: run for run in reader.poll().runs}
    board = reader.poll().leaderboard

    append_metrics(experiment / "run_lr1e-3", metrics_lines(13, 14, reward0=0.3, slope=0.04))
    snapshot = reader.poll()
    after = {run.id: run for run in snapshot.runs}
    assert after["run_lr1e-3"] is not before["run_lr1e-3"]
    assert after["run_lr1e-3"].step == 13
    assert all(after[run_id] is before[run_id] for run_id in before if run_id != "run_lr1e-3")
    assert snapshot.leaderboard is not board, "a run changed: ranked again"

    age_files(experiment)
    reader.poll()
    unchanged = reader.poll()
    assert reader.poll().leaderboard is unchanged.leaderboard, "nothing changed: kept"


def test_the_processes_of_an_unchanged_state_json_are_the_rows_of_the_last_poll(tmp_path):
    experiment = build_experiment(tmp_path)
    age_files(experiment)
    reader = ExperimentReader(experiment, supervisor_pid=lambda _: SUPERVISOR_PID)
    first = reader.poll().processes
    assert reader.poll().processes is first

    state_path = experiment / "supervisor" / "state.json"
    state = json.loads(state_path.read_text())
    state["processes"]["run_lr3e-4"]["state"] = "exited"
    state_path.write_text(json.dumps(state))
    after = {view.name: view for view in reader.poll().processes}
    assert after["run_lr3e-4"].state == "exited"
    before = {view.name: view for view in first}
    assert all(after[name] is before[name] for name in before if name != "run_lr3e-4")


def test_a_poll_looks_at_the_runs_that_changed_not_at_every_run(tmp_path, monkeypatch):
    """A sweep's hundreds of runs cost a poll what changed: the run written to, plus the
    slice of the others each poll looks at in turn; of every other run, only the change
    feed's one `stat` of each path it watches (`experiment_changes._SWEPT`)."""
    experiment = build_experiment(tmp_path)
    for index in range(80):
        append_metrics(
            make_run(experiment, f"run_many{index:02d}"),
            metrics_lines(1, 3, reward0=0.2, slope=0.1),
        )
    age_files(experiment)
    reader = ExperimentReader(experiment, supervisor_pid=lambda _: SUPERVISOR_PID)
    reader.poll(rank=False)
    reader.poll(rank=False)

    stats: Counter[str] = Counter()
    real_stat = os.stat

    def stat(path, *args, **kwargs):
        parts = (
            Path(path).relative_to(experiment).parts
            if str(path).startswith(str(experiment))
            else ()
        )
        if parts and layout.is_run_dir_name(parts[0]) and len(parts) > 1:
            stats[parts[0]] += 1
        return real_stat(path, *args, **kwargs)

    append_metrics(experiment / "run_many42", metrics_lines(3, 4, reward0=0.2, slope=0.1))
    monkeypatch.setattr(os, "stat", stat)
    snapshot = reader.poll(rank=False)  # as the TUI polls while no leaderboard is shown
    monkeypatch.undo()

    assert snapshot.run("run_many42").step == 3
    runs = len(snapshot.runs)
    slice_size = -(-runs // experiment_changes.FULL_PASS_LOOKS)
    swept = len(experiment_changes._SWEPT)
    assert set(stats) == {status.id for status in snapshot.runs}, "the feed's sweep"
    looked_at = {run_id for run_id, count in stats.items() if count > swept}
    assert "run_many42" in looked_at
    assert len(looked_at) <= 1 + slice_size < runs / 4
