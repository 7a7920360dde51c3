"""The main screen follows the experiment directory, and its keys do what the footer says."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

from textual.widgets._footer import FooterKey

from tests.tui.conftest import (
    SUPERVISOR_PID,
    RecordingCommands,
    next_polls,
    press_for,
    rows,
    wait_until,
)
from tests.tui.synthetic import (
    FROZEN_NOW,
    append_metrics,
    iso,
    make_run,
    metrics_lines,
    process,
    write_supervisor_state,
)
from workbench.files import busy, layout, run_control
from workbench.files.nodes import write_node_status
from workbench.supervisor import paths
from workbench.tui.collector import REFREEZE_GROWTH, YOUNG_THRESHOLD, QuietCollector
from workbench.tui.data import ExperimentReader
from workbench.tui.screens.add_run import AddRunScreen
from workbench.tui.screens.confirm import ConfirmScreen
from workbench.tui.screens.evict import EvictScreen
from workbench.tui.screens.help import HelpScreen
from workbench.tui.screens.main import MainScreen
from workbench.tui.screens.run_detail import RunDetailScreen
from workbench.tui.widgets.log_pane import LogPane
from workbench.tui.widgets.processes_table import ProcessesTable
from workbench.tui.widgets.runs_table import RunsTable


def startup_line(app) -> str | None:
    """The startup line's text, or None when it is not on screen."""
    line = app.screen.query_one("#startup")
    return str(line.render()) if line.display and line.region.height == 1 else None


async def test_a_line_under_the_top_bar_says_what_startup_does_until_everything_is_up(
    experiment, make_app
):
    inference = process("inference", "inference", "starting", 4201, 43)
    building = {"phase": "building model", "since": iso(2), "model": "builtin:tiny-reverse"}
    building.update(step=1, steps=3, detail="initial weights from seed 0")
    write_supervisor_state(experiment, SUPERVISOR_PID, {"inference": inference}, building)
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        assert startup_line(app) == (
            " building model builtin:tiny-reverse: step 1/3, initial weights from seed 0, 2s"
        )
        starting = {
            "phase": "starting",
            "since": iso(43),
            "process": "inference",
            "last_line": "INFO Started server process",
        }
        write_supervisor_state(experiment, SUPERVISOR_PID, {"inference": inference}, starting)
        await next_polls(pilot, app)
        assert startup_line(app) == (
            " starting inference: 43s, last line: INFO Started server process"
        )
        assert rows(app, RunsTable), "the runs table still shows under it at 80x24"
        inference = process("inference", "inference", "ready", 4201, 43)
        ready = {"phase": "ready", "since": iso(0), "detail": "up after 52s"}
        write_supervisor_state(experiment, SUPERVISOR_PID, {"inference": inference}, ready)
        await next_polls(pilot, app)
        assert startup_line(app) is None


async def test_tables_show_every_run_and_process_of_the_experiment(experiment, make_app):
    app = make_app(experiment)
    async with app.run_test(size=(160, 48)) as pilot:
        await next_polls(pilot, app)
        runs = rows(app, RunsTable)
        assert list(runs) == ["run_lr1e-3", "run_lr3e-4", "run_queued", "run_typo"]
        assert runs["run_lr1e-3"]["status"] == "active"
        assert runs["run_lr1e-3"]["step"] == "12/30"
        assert runs["run_lr1e-3"]["reward"] == "0.780"
        assert runs["run_lr1e-3"]["tokens"] == "12.0k"
        assert runs["run_lr1e-3"]["updated"] == "7s ago"  # its last trainer line
        assert runs["run_lr1e-3"]["trend"]  # a sparkline of the rewards so far
        assert runs["run_queued"]["status"] == "waiting"
        assert runs["run_typo"]["status"] == "rejected"
        assert "unknown key" in app.snapshot.run("run_typo").reason

        processes = rows(app, ProcessesTable)
        assert list(processes) == ["supervisor", "inference", "trainer", "run_lr1e-3", "run_lr3e-4"]
        assert processes["supervisor"]["pid"] == str(SUPERVISOR_PID)
        assert processes["inference"] == {
            "name": "inference",
            "state": "ready",
            "pid": "4101",
            "restarts": "0",
            "uptime": "2h59m",
            "busy": "-",  # no busy record
            "last_exit": "",
        }
        assert processes["trainer"]["restarts"] == "1"
        assert processes["trainer"]["last_exit"] == "exit code 1"
        assert processes["run_lr3e-4"]["uptime"] == "42s"


async def test_tables_follow_changes_to_the_directory(experiment, make_app):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)

        make_run(experiment, "run_new")
        run_control.write_eviction(experiment / "run_lr3e-4", "reward stuck at 0.38", by="test")
        append_metrics(experiment / "run_lr1e-3", metrics_lines(13, 15, reward0=0.3, slope=0.04))
        await next_polls(pilot, app)

        runs = rows(app, RunsTable)
        assert "run_new" in runs and runs["run_new"]["status"] == "waiting"
        assert runs["run_lr3e-4"]["status"] == "evicted"
        assert app.snapshot.run("run_lr3e-4").reason == "reward stuck at 0.38"
        assert runs["run_lr1e-3"]["step"] == "14/30"
        assert runs["run_lr1e-3"]["reward"] == "0.860"

        (experiment / "run_new" / "control" / "orch.toml").unlink()
        (experiment / "run_new" / "control").rmdir()
        (experiment / "run_new").rmdir()
        await next_polls(pilot, app)
        assert "run_new" not in rows(app, RunsTable)


async def test_an_update_keeps_the_order_and_the_selected_run(experiment, make_app):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        table = app.screen.query_one(RunsTable)
        order = list(rows(app, RunsTable))
        await pilot.press("down", "down")
        assert table.selected_key == "run_queued"

        append_metrics(experiment / "run_lr3e-4", metrics_lines(9, 11, reward0=0.3, slope=0.01))
        await next_polls(pilot, app)
        assert rows(app, RunsTable)["run_lr3e-4"]["step"] == "10/30"
        assert list(rows(app, RunsTable)) == order
        assert table.selected_key == "run_queued"


async def test_processes_table_follows_the_supervisor_state(experiment, make_app):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        write_supervisor_state(
            experiment,
            SUPERVISOR_PID,
            {"inference": process("inference", "inference", "backoff", 4201, 5, restarts=2)},
        )
        await next_polls(pilot, app)
        processes = rows(app, ProcessesTable)
        assert list(processes) == ["supervisor", "inference"]
        assert processes["inference"]["state"] == "backoff"
        assert processes["inference"]["restarts"] == "2"
        assert processes["inference"]["uptime"] == "-"


async def test_without_a_supervisor_the_files_are_still_shown(experiment, make_app):
    (experiment / "supervisor" / "state.json").unlink()
    app = make_app(
        experiment,
        commands=RecordingCommands(running=False),
        reader=ExperimentReader(experiment, supervisor_pid=lambda _: None),
    )
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        assert len(rows(app, RunsTable)) == 4
        assert rows(app, ProcessesTable) == {}
        assert not app.snapshot.supervisor.running

        await pilot.press("r")  # restart the selected run: nobody to ask
        await wait_until(
            pilot,
            lambda: any("supervisor not running" in n.message for n in app._notifications),
            what="a 'supervisor not running' notification",
        )


async def test_evict_key_asks_for_a_reason_and_writes_it(experiment, make_app, commands):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await pilot.press("e")
        assert isinstance(app.screen, EvictScreen)
        assert app.screen.run_id == "run_lr1e-3"
        await pilot.press(*"reward plateaued", "enter")

        evicted = experiment / "run_lr1e-3" / "control" / "evicted.txt"
        await wait_until(pilot, evicted.exists, what="evicted.txt")
        eviction = run_control.read_eviction(experiment / "run_lr1e-3")
        assert eviction.reason == "reward plateaued"
        assert eviction.evicted_by == "tui"
        await wait_until(pilot, lambda: commands.sent, what="the evict command")
        assert commands.sent == [
            ("evict", {"run_id": "run_lr1e-3", "reason": "reward plateaued", "by": "tui"})
        ]
        await next_polls(pilot, app)
        assert rows(app, RunsTable)["run_lr1e-3"]["status"] == "evicted"


async def test_cancelling_the_eviction_writes_nothing(experiment, make_app, commands):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await pilot.press("down", "e")
        assert isinstance(app.screen, EvictScreen)
        assert app.screen.run_id == "run_lr3e-4"
        await pilot.press(*"oops", "escape")
        assert not isinstance(app.screen, EvictScreen)
        await next_polls(pilot, app)
        assert not (experiment / "run_lr3e-4" / "control" / "evicted.txt").exists()
        assert commands.sent == []


async def test_quit_leaves_the_supervisor_running(experiment, make_app):
    # A stand-in supervisor: a long-lived process whose pid is in state.json.
    stand_in = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    try:
        write_supervisor_state(experiment, stand_in.pid, {})
        app = make_app(experiment)
        async with app.run_test(size=(80, 24)) as pilot:
            await next_polls(pilot, app)
            await pilot.press("q")
        assert app.return_code == 0
        assert stand_in.poll() is None, "quitting the TUI must not stop the supervisor"
        os.kill(stand_in.pid, 0)
    finally:
        stand_in.kill()
        stand_in.wait()


async def test_the_collector_is_quieted_while_the_tui_runs_and_given_back_on_quit(
    experiment, make_app
):
    # The TUI freezes its long-lived objects so full collections do not stall keys; the
    # process (a test run, an embedding program) gets Python's collector back as it was.
    before = gc.get_threshold()
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await wait_until(pilot, lambda: gc.get_freeze_count() > 0, what="the freeze")
        assert gc.get_threshold()[0] >= YOUNG_THRESHOLD
        # A cycle alive at a full collection and dropped later is still freed: a TUI
        # left open for days must not keep every screen switch's leftovers.
        gc.collect()  # whatever the app made so far, frozen or not
        frozen = gc.get_freeze_count()
        cycle: list = []
        cycle.append(cycle)
        gc.collect()
        # Not more: a frozen object that the app (or another thread) drops meanwhile leaves
        # the permanent generation by its reference count, so the count may also fall.
        assert gc.get_freeze_count() <= frozen, "a little growth is not frozen"
        del cycle
        assert gc.collect() >= 1
        # A TUI that grew (runs added for hours) has what it made since frozen as a full
        # collection ends, so the next one does not walk all of it again.
        kept = [[] for _ in range(int(REFREEZE_GROWTH * frozen) + 1)]
        gc.collect()
        assert gc.get_freeze_count() >= frozen + len(kept)
        await pilot.press("q")
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


async def test_restart_acts_on_the_selected_run_or_process(experiment, make_app, commands):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await pilot.press("r")  # the runs table has focus: its first run
        await wait_until(pilot, lambda: len(commands.sent) == 1)
        assert commands.sent[-1] == ("restart_run", {"run_id": "run_lr1e-3"})

        await pilot.press("tab", "down", "down", "down")  # processes: run_lr1e-3's orchestrator
        await pilot.press("r")
        await wait_until(pilot, lambda: len(commands.sent) == 2)
        assert commands.sent[-1] == ("restart_process", {"name": "run_lr1e-3"})

        await pilot.press("up", "r")  # the trainer: every run waits, so it asks first
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_until(pilot, lambda: len(commands.sent) == 3)
        assert commands.sent[-1] == ("restart_process", {"name": "trainer"})


async def test_add_run_sends_the_id_and_overrides(experiment, make_app, commands):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await pilot.press("a")
        assert isinstance(app.screen, AddRunScreen)
        await pilot.press(*"bad id", "enter", "enter")
        assert isinstance(app.screen, AddRunScreen), "an invalid id keeps the dialog open"
        app.screen.query_one("#add-run-id").value = "lr3e-3"
        app.screen.query_one("#add-run-overrides").value = "lr=3e-3 sampling.temperature=0.7"
        await pilot.press("enter")
        await wait_until(pilot, lambda: commands.sent, what="the add_run command")
        assert commands.sent == [
            (
                "add_run",
                {
                    "run_id": "run_lr3e-3",
                    "overrides": {"lr": 3e-3, "sampling": {"temperature": 0.7}},
                },
            )
        ]


async def test_stop_all_asks_first(experiment, make_app, commands):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await pilot.press("S")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await next_polls(pilot, app)
        assert commands.sent == []
        await pilot.press("S", "y")
        await wait_until(pilot, lambda: commands.sent, what="the stop_all command")
        assert commands.sent == [("stop_all", {})]
        assert not isinstance(app.screen, ConfirmScreen)


async def test_enter_opens_the_run_detail_with_reason_curves_and_config(experiment, make_app):
    run_control.write_eviction(experiment / "run_lr1e-3", "learning rate too high", by="test")
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await pilot.press("enter")
        assert isinstance(app.screen, RunDetailScreen)
        screen = app.screen
        await wait_until(pilot, lambda: screen.query_one("#reward-chart").values)
        assert len(screen.query_one("#reward-chart").values) == 12
        assert len(screen.query_one("#loss-chart").values) == 12
        assert "learning rate too high" in str(screen.query_one("#detail-reason").content)
        config = screen.query_one("#detail-config")
        await wait_until(pilot, lambda: "lr = 1e-3" in str(config.content), what="orch.toml")
        await pilot.press("escape")
        assert not isinstance(app.screen, RunDetailScreen)


async def test_the_run_detail_shows_each_run_chosen_in_turn(experiment, make_app):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await press_for(pilot, "enter", RunDetailScreen)
        first = app.screen
        assert first.run_id == "run_lr1e-3"
        await press_for(pilot, "escape", MainScreen)
        await pilot.press("down")
        await press_for(pilot, "enter", RunDetailScreen)
        assert app.screen is first, "the same screen, shown for another run"
        summary = app.screen.query_one("#detail-summary")
        assert str(summary.content).startswith("run_lr3e-4")
        assert len(app.screen.query_one("#reward-chart").values) == 8
        config = app.screen.query_one("#detail-config")
        await wait_until(pilot, lambda: "lr = 3e-4" in str(config.content), what="orch.toml")


async def test_the_run_detail_says_which_run_and_step_a_forked_run_came_from(experiment, make_app):
    orch_toml = experiment / "run_lr3e-4" / "control" / "orch.toml"
    with orch_toml.open("a") as out:
        out.write('\n[forked_from]\nrun = "run_lr1e-3"\nstep = 10\n')
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        await pilot.press("down")
        await press_for(pilot, "enter", RunDetailScreen)
        summary = app.screen.query_one("#detail-summary")
        assert "forked from run_lr1e-3@10" in str(summary.content)


async def test_a_diverged_run_reads_diverged_with_the_trainers_reason(experiment, make_app):
    why = "diverged: gradient norm nan at updates 3-5; try a lower lr in a new run"
    run_control.write_eviction(experiment / "run_lr1e-3", why, by="trainer")
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        assert rows(app, RunsTable)["run_lr1e-3"]["status"] == "diverged"
        assert "1 diverged" in str(app.screen.query_one("#top-bar").content)
        await pilot.press("enter")
        assert isinstance(app.screen, RunDetailScreen)
        reason = str(app.screen.query_one("#detail-reason").content)
        assert reason == f"eviction reason: {why}"


async def test_follow_key_switches_the_log_to_the_selected_process(experiment, make_app):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await next_polls(pilot, app)
        pane = app.screen.query_one(LogPane)
        assert pane.target.path == experiment / "run_lr1e-3" / "logs" / "orchestrator.log"
        await pilot.press("tab", "down", "down", "f")  # processes: the trainer
        assert pane.target.path == experiment / "logs" / "trainer.log"
        await wait_until(pilot, lambda: "trainer up" in pane.log.lines, what="trainer.log lines")


async def test_help_lists_the_keys_and_closes(experiment, make_app):
    app = make_app(experiment)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


def test_the_tui_package_exposes_only_run_tui():
    import workbench.tui

    assert workbench.tui.__all__ == ["run_tui"]
    assert callable(workbench.tui.run_tui)
    assert Path(workbench.tui.__file__).parent.joinpath("workbench.tcss").is_file()


async def test_the_processes_pane_shows_each_process_busy_share_of_its_last_minute(
    experiment, make_app
):
    # The trainer updated for 45 of its last 60 s; two orchestrators each generated for 20 s,
    # overlapping by 10: vLLM answered one of them for 30 of those 60 s.
    end = FROZEN_NOW - 5
    records = {
        "trainer": [("update", busy.BUSY, end - 60, end - 15)],
        "run_lr1e-3": [(busy.GENERATION, busy.BUSY, end - 60, end - 40)],
        "run_lr3e-4": [(busy.GENERATION, busy.BUSY, end - 50, end - 30)],
    }
    for name, (busy_part, *_) in records.items():
        label, kind, start, stop = busy_part
        waiting = busy.Interval("waiting", busy.WAITING, stop, end)
        record = busy.BusyRecord(
            process=name, pid=None, started_at=end - 60, written_at=end, window_s=60,
            current=waiting, intervals=(busy.Interval(label, kind, start, stop),),
            totals={label: (kind, stop - start), "waiting": (busy.WAITING, end - stop)},
        )  # fmt: skip
        busy.write_record(layout.busy_path(experiment, name), record)
    app = make_app(experiment)
    async with app.run_test(size=(160, 48)) as pilot:
        await next_polls(pilot, app)
        processes = rows(app, ProcessesTable)
        assert processes["trainer"]["busy"] == "75%"
        assert processes["run_lr1e-3"]["busy"] == "33%"
        assert processes["inference"]["busy"] == "50%"
        assert processes["supervisor"]["busy"] == "-"


async def test_screen_switches_leave_no_footer_keys_behind(experiment, make_app, monkeypatch):
    # Every switch makes the footers' keys again; the old ones must go, or a TUI left
    # open keeps a footer's worth of widgets per `enter` and `escape` for its whole life.
    # (The collector's freeze is off here, so that every key is in gc's lists to count.)
    monkeypatch.setattr(QuietCollector, "settle", lambda self: None)
    app = make_app(experiment)
    async with app.run_test(size=(120, 40)) as pilot:
        await next_polls(pilot, app)

        def live_keys() -> int:
            gc.collect()
            # type(), not isinstance(): some module proxies warn when asked their class.
            return sum(type(o) is FooterKey for o in gc.get_objects())

        for _ in range(2):
            await pilot.press("enter")
            await pilot.pause()
            await pilot.press("escape")
            await pilot.pause()
        before = live_keys()
        for _ in range(10):
            await pilot.press("enter")
            await pilot.pause()
            await pilot.press("escape")
            await pilot.pause()
        await pilot.pause(0.2)
        assert live_keys() <= before
        await pilot.press("q")


async def test_a_joined_node_has_a_row_whose_log_can_be_followed_but_not_restarted(
    experiment, make_app, commands
):
    paths.rendezvous_path(experiment).write_text(
        json.dumps({"host": "127.0.0.1", "port": 29400, "nnodes": 2, "node0_host": "gpu-1"})
    )
    write_node_status(experiment, 1, 2, "gpu-2", 77, "restarting", 2, "meeting node 0 again")
    log = layout.process_log_path(experiment, "trainer-node1")
    log.write_text("node 1 agent up\n")
    app = make_app(experiment)
    async with app.run_test(size=(120, 30)) as pilot:
        await next_polls(pilot, app)
        processes = rows(app, ProcessesTable)
        node = processes["trainer-node1"]
        assert (node["state"], node["restarts"]) == ("restarting", "2")
        assert node["last_exit"].startswith("on gpu-2")
        last = list(processes).index("trainer-node1")
        await pilot.press("tab", *["down"] * last, "f")
        pane = app.screen.query_one(LogPane)
        assert pane.target.path == log
        await pilot.press("r")
        await pilot.pause()
        assert commands.sent == [], "another machine's join is not the supervisor's to restart"
