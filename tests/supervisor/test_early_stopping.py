"""Early stopping in the running supervisor: a run that falls behind at a rung is evicted
with the documented reason, and the run waiting for a trainer slot takes its slot.

The real daemon, the real slot bookkeeping (`standin_trainer.py` runs `MultiRunManager`),
and orchestrator stand-ins that write eval records while their run holds a slot.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import wait_for
from tests.supervisor.conftest import StandinExperiment
from workbench.cli import app
from workbench.files import layout, run_control
from workbench.supervisor.launch import PLAN_ENV
from workbench.sweep.files import read_asha
from workbench.testing import standins

STANDIN_TRAINER = Path(__file__).with_name("standin_trainer.py")
SCHEDULER = """
[sweep.scheduler]
kind = "asha"
grace_steps = 2
reduction_factor = 2
min_runs = 2
"""


def slots(experiment: Path) -> list[str]:
    try:
        state = json.loads(layout.trainer_state_path(experiment).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    return sorted(state["slots"].values())


def curve(run: Path, values: list[float], interval_s: float) -> None:
    plan = {"metric": "eval_reward_mean", "values": values, "interval_s": interval_s}
    (run / "standin_metrics.json").write_text(json.dumps(plan))


def with_slots(standin: StandinExperiment, slots: int, orchestrator_args: list[str]) -> None:
    """Stand-ins, with a trainer that keeps `slots` slots as the real one does."""
    trainer = [sys.executable, STANDIN_TRAINER, "--experiment", standin.path, "--max-runs", slots]
    standin.configure(
        processes=[
            {"name": "inference", "kind": "inference", "ready": True},
            {"name": "trainer", "kind": "trainer", "argv": [str(arg) for arg in trainer]},
        ],
        orchestrator={"args": orchestrator_args},
    )


def test_a_run_behind_at_a_rung_is_evicted_and_the_waiting_run_takes_its_slot(
    standin: StandinExperiment,
):
    recipe = layout.recipe_path(standin.path)
    recipe.write_text(recipe.read_text() + SCHEDULER)
    with_slots(standin, 2, ["--write-metrics"])
    run_a, run_b, run_c = standin.add_runs("run_a", "run_b", "run_c")
    # run_a learns fast and reaches step 2 first; run_b is slow and poor; run_c waits.
    curve(run_a, [0.5, 0.6, 0.7, 0.8, 0.9], interval_s=0.05)
    curve(run_b, [0.0, 0.05, 0.1, 0.1, 0.1], interval_s=0.4)
    curve(run_c, [0.5, 0.6, 0.7], interval_s=0.05)
    standin.start()

    wait_for(lambda: slots(standin.path) == ["run_a", "run_b"], 30, "run_a and run_b to get slots")
    eviction = wait_for(lambda: run_control.read_eviction(run_b), 30, "run_b to be evicted")
    assert eviction.reason == "asha rung 0 (step 2): eval_reward_mean 0.1 < cutoff 0.4, rank 2/2"
    assert eviction.evicted_by == "asha"
    assert run_control.read_eviction(run_a) is None

    wait_for(lambda: "run_c" in slots(standin.path), 10, "run_c to take the freed slot")
    admitted_after = time.time() - layout.evicted_path(run_b).stat().st_mtime
    print(f"run_c admitted {admitted_after:.2f}s after run_b's eviction")
    assert admitted_after < 5, f"run_c waited {admitted_after:.1f}s for the freed slot"
    assert slots(standin.path) == ["run_a", "run_c"]
    process = standin.wait_for_process("run_b", "stopped")
    assert process["reason"] == f"evicted: {eviction.reason}"
    wait_for(lambda: layout.metrics_path(run_c).exists(), 10, "run_c to make progress")

    decisions = read_asha(standin.path)
    assert decisions is not None
    assert ("run_b", 0) in decisions.actions and decisions.actions[("run_b", 0)] == "evicted"

    shown = CliRunner().invoke(app, ["status", str(standin.path), "--json"])
    assert shown.exit_code == 0, shown.output
    runs = {run["id"]: run for run in json.loads(shown.output)["runs"]}
    assert runs["run_b"]["status"] == "evicted"
    assert runs["run_b"]["asha"] == {
        "rung": 0,
        "step": 2,
        "value": 0.1,
        "cutoff": 0.4,
        "rank": 2,
        "of": 2,
        "decision": "stop",
    }
    assert runs["run_a"]["asha"]["rung"] >= 0
    table = CliRunner().invoke(app, ["status", str(standin.path)], env={"COLUMNS": "200"})
    assert "rung" in table.output and "2/2" in table.output


def test_up_headless_counts_a_run_stopped_early_as_an_outcome_not_a_failure(
    standin: StandinExperiment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(PLAN_ENV, standins.PLAN_REFERENCE)
    with_slots(standin, 2, ["--write-metrics", "--finish-after", "0"])
    recipe = tmp_path / "recipe.toml"
    runs = '[[runs]]\nid = "a"\n\n[[runs]]\nid = "b"\n'
    recipe.write_text(layout.recipe_path(standin.path).read_text() + runs + SCHEDULER)
    for run_id, values, interval in (("run_a", [0.5, 0.6, 0.7], 0.05), ("run_b", [0.1] * 10, 0.3)):
        (standin.path / run_id).mkdir()
        curve(standin.path / run_id, values, interval)

    result = CliRunner().invoke(app, ["up", str(recipe), "--headless"], catch_exceptions=False)
    evicted = [line for line in result.output.splitlines() if "run_b: evicted" in line]
    assert len(evicted) == 1, result.output
    assert evicted[0].endswith("asha rung 0 (step 2): eval_reward_mean 0.1 < cutoff 0.4, rank 2/2")
    assert "every run finished (1, 1 stopped early by asha)" in result.output
    assert result.exit_code == 0, result.output
