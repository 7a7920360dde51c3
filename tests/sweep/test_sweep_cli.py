"""`workbench sweep plan`, `up --dry-run`, and what a sweep leaves in the experiment
directory for `workbench status`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomlkit
from typer.testing import CliRunner

from workbench.cli import app
from workbench.config import load_orchestrator_config
from workbench.experiment import create_experiment
from workbench.files import layout
from workbench.recipe import recipe_from_document
from workbench.status import run_statuses
from workbench.sweep import expand
from workbench.up import read_recipe

RECIPE = """\
[experiment]
name = "lr_rank"

[model]
base = "builtin:tiny-reverse"

[trainer]
max_concurrent_runs = 2

[defaults]
max_steps = 30

[[runs]]
id = "baseline"

[sweep.grid]
lr = [1e-3, 3e-3]
lora.rank = [4, 8]

[sweep.scheduler]
kind = "asha"
grace_steps = 5
"""


@pytest.fixture
def cli(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipe.toml").write_text(RECIPE)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "160"})

    return invoke


def test_sweep_plan_lists_every_run_in_slot_order_with_its_values(cli, tmp_path: Path):
    result = cli("sweep", "plan", "recipe.toml")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "5 runs (1 from [[runs]], 4 from [sweep]); 2 trainer slots: 3 wait" in lines[0]
    rows = [line.split() for line in lines[2:7]]
    assert [row[1] for row in rows] == [
        "run_baseline",
        "run_lr1e-3_rank4",
        "run_lr1e-3_rank8",
        "run_lr3e-3_rank4",
        "run_lr3e-3_rank8",
    ]
    assert rows[0][2:] == ["at", "once", "-"]
    assert rows[4][2:] == ["waits", "(3)", "lr=0.003", "lora.rank=8"]
    assert (
        "early stopping: asha on eval_reward_mean (max), rungs at steps 5, 10, 20" in result.output
    )
    assert not (tmp_path / "outputs").exists()


def test_sweep_plan_json_for_scripts(cli):
    result = cli("sweep", "plan", "recipe.toml", "--json", "--max-steps", "50")
    payload = json.loads(result.output)
    assert payload["slots"] == 2
    assert payload["runs"][1] == {
        "id": "run_lr1e-3_rank4",
        "source": "sweep",
        "position": 1,
        "values": {"lr": 0.001, "lora.rank": 4},
    }
    assert payload["early_stopping"]["rung_steps"] == [5, 10, 20, 40]
    assert payload["early_stopping"]["metric"] == "eval_reward_mean"


def test_up_dry_run_prints_the_plan_and_writes_nothing(cli, tmp_path: Path):
    result = cli("up", "recipe.toml", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "run_lr3e-3_rank8" in result.output
    assert "trainer on 1 node(s): rendezvous on 127.0.0.1, a free port (loopback only" in (
        result.output
    )
    assert "nothing was written or started" in result.output
    assert not (tmp_path / "outputs").exists()


def test_a_bad_sweep_exits_2_naming_file_line_and_key_and_writes_nothing(cli, tmp_path: Path):
    (tmp_path / "recipe.toml").write_text(RECIPE.replace("lr = [1e-3, 3e-3]", "lr = [1e-3, -3]"))
    for command in (
        ["up", "recipe.toml"],
        ["up", "recipe.toml", "--dry-run"],
        ["sweep", "plan", "recipe.toml"],
    ):
        result = cli(*command)
        assert result.exit_code == 2
        assert "recipe.toml, line 17: sweep.grid.lr: value 2 of 2 (-3)" in result.output
    assert not (tmp_path / "outputs").exists()


def test_a_command_expands_the_sweep_once(cli, tmp_path: Path, monkeypatch):
    """The loader plans the runs; the plan printed, the pre-launch checks that locate a
    problem and the experiment's files read them from the recipe."""
    expansions = []
    original = expand._expand
    monkeypatch.setattr(expand, "_expand", lambda *args: expansions.append(args) or original(*args))
    for command in (["up", "recipe.toml", "--dry-run"], ["sweep", "plan", "recipe.toml"]):
        expansions.clear()
        assert cli(*command).exit_code == 0
        assert len(expansions) == 1, command
    expansions.clear()
    document, recipe = read_recipe(tmp_path / "recipe.toml")
    create_experiment(recipe, document)
    assert len(expansions) == 1, "up"
    too_long = RECIPE.replace("lora.rank = [4, 8]", "sampling.max_tokens = [64, 4000]")
    (tmp_path / "recipe.toml").write_text(too_long)
    expansions.clear()
    result = cli("up", "recipe.toml", "--dry-run")
    assert result.exit_code == 2 and "sweep.grid.sampling.max_tokens" in result.output
    assert len(expansions) == 1, "a problem located"


def test_an_experiment_keeps_each_runs_values_for_status(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    document = tomlkit.parse(RECIPE)
    experiment = create_experiment(recipe_from_document(document, "recipe.toml"), document)
    orch = layout.orch_config_path(experiment / "run_lr3e-3_rank4")
    assert "# Sweep values: lr=0.003 lora.rank=4" in orch.read_text()
    assert load_orchestrator_config(orch).lora.rank == 4
    values = {run.id: run.values for run in run_statuses(experiment)}
    assert values["run_lr3e-3_rank4"] == {"lr": 0.003, "lora.rank": 4}
    assert values["run_baseline"] == {}
    plan = json.loads(layout.sweep_plan_path(experiment).read_text())
    assert [run["id"] for run in plan["runs"]][:2] == ["run_baseline", "run_lr1e-3_rank4"]
