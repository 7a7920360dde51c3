"""The supervisor's alert watcher on real run directories: what it appends to alerts.jsonl,
once per episode, across a restarted supervisor, and what `workbench alerts` prints."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from typer.testing import CliRunner

from tests.helpers import make_run
from workbench.alerts.watcher import AlertWatcher
from workbench.cli import app
from workbench.config.alerts import AlertsSection
from workbench.files import layout, run_control
from workbench.files.alerts import read_alerts
from workbench.files.metrics import append_metrics


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def watcher(experiment: Path, clock: Clock, section: AlertsSection | None = None, sent=None):
    return AlertWatcher(
        experiment,
        section or AlertsSection(),
        on_alert=None if sent is None else sent.append,
        interval_s=0,
        clock=clock,
    )


def diverge(run: Path) -> None:
    for step, loss in enumerate([0.1, math.nan, math.nan], start=1):
        append_metrics(run, "trainer", step, loss=loss, grad_norm=0.2)


def test_a_nan_loss_is_one_line_of_alerts_jsonl_and_handed_on(tmp_path: Path):
    run = make_run(tmp_path, "run_a")
    clock, sent = Clock(), []
    alerts = watcher(tmp_path, clock, sent=sent)
    diverge(run)
    raised = alerts.poll()
    assert [(a.run, a.rule, a.step) for a in raised] == [("run_a", "non_finite", 2)]
    assert read_alerts(tmp_path) == raised == sent
    line = json.loads(layout.alerts_path(tmp_path).read_text())
    assert line["values"]["loss"] == "nan"  # strict JSON for jq
    assert alerts.poll() == []


def test_a_restarted_supervisor_reads_every_record_again_and_raises_nothing_twice(tmp_path):
    run = make_run(tmp_path, "run_a")
    diverge(run)
    watcher(tmp_path, Clock()).poll()
    again = watcher(tmp_path, Clock())
    assert again.poll() == []
    append_metrics(run, "trainer", 4, loss=0.1, grad_norm=0.2)
    append_metrics(run, "trainer", 5, loss=math.inf, grad_norm=0.2)
    assert [a.step for a in again.poll()] == [5]
    assert len(read_alerts(tmp_path)) == 2


def test_an_open_run_quiet_for_stall_s_stalls_once_and_a_finished_one_never(tmp_path):
    clock = Clock(time.time())
    quiet, done = make_run(tmp_path, "run_quiet"), make_run(tmp_path, "run_done")
    for run in (quiet, done):
        append_metrics(run, "orchestrator", 0, reward_mean=0.5)
    run_control.mark_finished(done, 1)
    alerts = watcher(tmp_path, clock, AlertsSection(stall_s=60))
    assert alerts.poll() == []
    clock.now += 3600  # the records' times are real: an hour after the watcher started
    assert [(a.run, a.rule) for a in alerts.poll()] == [("run_quiet", "stall")]
    clock.now += 3600
    assert alerts.poll() == []


def test_a_process_failing_three_times_in_the_window_is_one_restarts_alert(tmp_path):
    clock = Clock()
    alerts = watcher(tmp_path, clock)
    now = clock.now
    assert alerts.poll({"trainer": [now - 300, now - 100]}) == []
    raised = alerts.poll({"trainer": [now - 300, now - 100, now - 1]})
    assert [(a.run, a.process, a.rule) for a in raised] == [(None, "trainer", "restarts")]
    assert alerts.poll({"trainer": [now - 300, now - 100, now - 1]}) == []


def test_alerts_switched_off_or_one_rule_disabled_raise_nothing(tmp_path):
    diverge(make_run(tmp_path, "run_a"))
    assert watcher(tmp_path, Clock(), AlertsSection(enabled=False)).poll() == []
    assert watcher(tmp_path, Clock(), AlertsSection(disabled=["non_finite"])).poll() == []
    assert not layout.alerts_path(tmp_path).exists()


def test_the_alerts_command_prints_them_as_json_and_since_a_time(tmp_path):
    diverge(make_run(tmp_path, "run_a"))
    clock = Clock()
    watcher(tmp_path, clock).poll()
    runner = CliRunner()
    result = runner.invoke(app, ["alerts", str(tmp_path), "--json"], catch_exceptions=False)
    payload = json.loads(result.stdout)
    [alert] = payload["alerts"]
    assert (alert["run"], alert["rule"], alert["step"]) == ("run_a", "non_finite", 2)
    assert alert["at"].startswith("1970-01-12T13:46:40")
    later = runner.invoke(app, ["alerts", str(tmp_path), "--json", "--since", "1h"])
    assert json.loads(later.stdout)["alerts"] == []  # raised at the fake clock's 1970
    table = runner.invoke(app, ["alerts", str(tmp_path)], catch_exceptions=False)
    assert "non_finite" in table.stdout and "run_a" in table.stdout


def test_a_since_that_is_neither_a_duration_nor_a_time_is_bad_input(tmp_path):
    result = CliRunner().invoke(app, ["alerts", str(tmp_path), "--since", "yesterday"])
    assert result.exit_code == 2
    assert "--since 'yesterday'" in result.output
