"""`workbench bench supervisor` and `workbench bench all`: what they write, not how fast.

The supervisor benchmark runs for real (a real supervisor on the stand-in plan, the real
TUI headless) with every knob turned down; `all` is checked with small benchmark bodies
standing in for the real ones, which take minutes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.bench import cli as bench_cli
from workbench.cli import app
from workbench.supervisor.client import running_supervisor_pid

runner = CliRunner()


def test_supervisor_benchmark_writes_every_measurement_and_leaves_nothing_running(
    tmp_path: Path,
):
    results, workdir = tmp_path / "results", tmp_path / "experiments"
    args = ["bench", "supervisor", "--trials", "1", "--idle-seconds", "1", "--log-rates", "500"]
    args += ["--log-seconds", "1", "--no-tmux", "--results-dir", str(results)]
    args += ["--workdir", str(workdir)]

    outcome = runner.invoke(app, args)

    assert outcome.exit_code == 0, outcome.output
    latest = json.loads((results / "supervisor-latest.json").read_text())
    assert latest["benchmark"] == "supervisor"
    assert {"machine", "settings", "load_average_start", "summary"} <= set(latest)
    for mode in ("write_run", "rename"):
        visible = latest["discovery"]["modes"][mode]["visible"]
        assert {"median_ms", "p90_ms"} <= set(visible)
    assert len(latest["discovery"]["samples"]) == 2  # one trial of each way to create a run
    idle = latest["tui_idle"]["headless"]
    assert idle["runs_shown"] == 8
    assert {"app_cpu_percent", "supervisor_cpu_percent", "polls"} <= set(idle)
    assert latest["tui_idle"]["tmux"] == {"skipped": "--no-tmux"}
    (rate,) = latest["log_throughput"]["rates"]
    assert rate["offered_lines_per_s"] == 500 and rate["written_lines"] == 500
    assert {"lag_lines_at_end", "catch_up_s", "max_loop_stall_ms", "kept_up"} <= set(rate)
    assert {row["metric"] for row in latest["summary"]} >= {
        "discovery, runs add: median",
        "TUI idle CPU, 8 runs (headless)",
        "log pane keeps up with",
    }
    assert len(list(results.glob("supervisor-2*.json"))) == 1  # plus the -latest copy
    for experiment in (workdir / "discovery", workdir / "tui"):
        assert running_supervisor_pid(experiment) is None


@pytest.fixture
def in_tmp_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # `all` writes to ./benchmarks/results, like `just bench`.
    monkeypatch.chdir(tmp_path)
    return tmp_path / "benchmarks" / "results"


def test_bench_all_passes_quick_on_and_summarises_each_benchmark(
    in_tmp_results: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(
        bench_cli.BENCHMARKS,
        "supervisor",
        lambda quick: [bench_cli._summary_row("supervisor", "quick?", str(quick))],
    )

    outcome = runner.invoke(app, ["bench", "all", "--quick", "--only", "supervisor"])

    assert outcome.exit_code == 0, outcome.output
    summary = json.loads((in_tmp_results / "summary-latest.json").read_text())
    assert summary["quick"] is True
    assert summary["benchmarks"]["supervisor"]["status"] == "ok"
    assert {"benchmark": "supervisor", "metric": "quick?", "value": "True"} in summary["rows"]


def test_bench_all_reports_a_failing_benchmark_runs_the_others_and_exits_1(
    in_tmp_results: Path, monkeypatch: pytest.MonkeyPatch
):
    def broken(quick: bool) -> list:
        raise RuntimeError("no GPU here")

    monkeypatch.setitem(bench_cli.BENCHMARKS, "inference", broken)
    monkeypatch.setitem(
        bench_cli.BENCHMARKS,
        "supervisor",
        lambda quick: [bench_cli._summary_row("supervisor", "discovery", "20 ms")],
    )

    outcome = runner.invoke(app, ["bench", "all", "--only", "inference,supervisor"])

    assert outcome.exit_code == 1
    summary = json.loads((in_tmp_results / "summary-latest.json").read_text())
    assert summary["benchmarks"]["inference"] == {
        "status": "failed",
        "message": "RuntimeError: no GPU here",
        "seconds": summary["benchmarks"]["inference"]["seconds"],
    }
    assert summary["benchmarks"]["supervisor"]["status"] == "ok"


def test_bench_all_refuses_an_unknown_benchmark_name():
    outcome = runner.invoke(app, ["bench", "all", "--only", "trainer,gpu_magic"])
    assert outcome.exit_code == 2
    assert "gpu_magic" in outcome.output


def test_bench_all_counts_a_benchmark_whose_experiment_failed_as_failed_keeping_its_rows(
    in_tmp_results: Path, monkeypatch: pytest.MonkeyPatch
):
    from workbench.bench import e2e

    def run(quick: bool = False) -> dict:
        return {
            "summary": [{"metric": "reward first 5 -> last 5", "value": "0.5 -> 0.4"}],
            "exit_code": 1,
        }

    monkeypatch.setattr(e2e, "run_e2e_benchmark", run)

    outcome = runner.invoke(app, ["bench", "all", "--only", "e2e"])

    assert outcome.exit_code == 1
    summary = json.loads((in_tmp_results / "summary-latest.json").read_text())
    assert summary["benchmarks"]["e2e"]["status"] == "failed"
    assert [row["metric"] for row in summary["rows"]] == ["reward first 5 -> last 5", "FAILED"]


@pytest.mark.parametrize(
    ("losses", "expected"),
    [("ppo,grpo", "unknown loss.kind 'grpo'"), ("ppo,ppo+ref", "the one suffix is +kl")],
)
def test_bench_trainer_refuses_an_unknown_loss_before_measuring(losses: str, expected: str):
    outcome = runner.invoke(app, ["bench", "trainer", "--models", "tiny", "--losses", losses])
    assert outcome.exit_code == 2 and expected in outcome.output
