"""`workbench up`, `status --json` and `evict` on synthetic experiment directories."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tests.helpers import make_run
from workbench.cli import app
from workbench.files import layout, run_control
from workbench.supervisor import paths
from workbench.testing import standins

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cli(tmp_path: Path, monkeypatch):
    """Run the CLI from a scratch working directory, so ./outputs is the test's own."""
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args), catch_exceptions=False)

    return invoke


DIVERGED_WHY = "diverged: gradient norm nan at updates 3-5; try a lower lr in a new run"


@pytest.fixture
def synthetic(tmp_path: Path) -> Path:
    """outputs/exp with one run in every status."""
    experiment = tmp_path / "outputs" / "exp"
    names = ("run_wait", "run_active", "run_rejected", "run_evicted", "run_diverged", "run_done")
    for name in names:
        make_run(experiment, name, "max_steps = 20\n")
    (experiment / "recipe.toml").write_text("")
    run_control.write_validation_error(experiment / "run_rejected", "orch.toml: [lr] must be > 0")
    run_control.write_eviction(experiment / "run_evicted", "reward collapsed", by="trainer")
    run_control.write_eviction(experiment / "run_diverged", DIVERGED_WHY, by="trainer")
    run_control.mark_finished(experiment / "run_done", 20)
    layout.atomic_write_text(
        layout.trainer_state_path(experiment),
        json.dumps(
            {
                "pid": os.getpid(),
                "slots": {"0": "run_active"},
                "progress": {"run_active": {"step": 7, "total_tokens": 4096, "total_samples": 64}},
            }
        ),
    )
    return experiment


def test_status_json_reports_every_run_with_status_step_and_reason(cli, synthetic: Path):
    result = cli("status", "--json")
    assert result.exit_code == 0, result.output
    runs = {run["id"]: run for run in json.loads(result.output)["runs"]}
    assert {rid: run["status"] for rid, run in runs.items()} == {
        "run_active": "active",
        "run_done": "finished",
        "run_evicted": "evicted",
        "run_diverged": "diverged",
        "run_rejected": "rejected",
        "run_wait": "waiting",
    }
    assert runs["run_active"]["step"] == 7 and runs["run_active"]["max_steps"] == 20
    assert runs["run_evicted"]["reason"] == "reward collapsed"
    assert runs["run_diverged"]["reason"] == DIVERGED_WHY
    assert runs["run_diverged"]["evicted_by"] == "trainer"
    assert "must be > 0" in runs["run_rejected"]["reason"]
    assert runs["run_wait"]["reason"] is None
    assert set(runs["run_wait"]) >= {"id", "status", "step", "reason"}


def test_status_treats_a_dead_trainers_slots_as_waiting(cli, synthetic: Path):
    state = json.loads(layout.trainer_state_path(synthetic).read_text())
    state["pid"] = 2**22 + 12345  # no such process
    layout.trainer_state_path(synthetic).write_text(json.dumps(state))
    runs = {r["id"]: r for r in json.loads(cli("status", "--json").output)["runs"]}
    assert runs["run_active"]["status"] == "waiting"


def test_status_counts_trained_steps_from_stable_broadcasts(cli, synthetic: Path):
    for step in (1, 2, 3):
        stable = layout.broadcast_dir(synthetic / "run_wait", step)
        stable.mkdir(parents=True)
        if step < 3:
            layout.mark_stable(stable)
    runs = {r["id"]: r for r in json.loads(cli("status", "--json").output)["runs"]}
    assert runs["run_wait"]["step"] == 2, "an unstable step_3 is not trained yet"


def test_status_of_an_explicit_directory_and_human_table(cli, synthetic: Path):
    result = cli("status", str(synthetic))
    assert result.exit_code == 0
    assert "run_active" in result.output and "7/20" in result.output


def test_status_shows_where_the_supervisor_placed_its_processes(cli, synthetic: Path):
    placement = "2 GPU(s): inference on [0], trainer on [1]; trainer: 1 rank, the whole base"
    state = {"status": "stopped", "processes": {}, "placement": placement}
    paths.state_path(synthetic).parent.mkdir(parents=True, exist_ok=True)
    paths.state_path(synthetic).write_text(json.dumps(state))
    assert f"placement: {placement}" in cli("status", str(synthetic)).output.replace("\n", " ")
    assert json.loads(cli("status", str(synthetic), "--json").output)["placement"] == placement


def test_status_without_experiments_says_where_it_looked(cli):
    result = cli("status")
    assert result.exit_code == 1
    assert "no experiment found under ./outputs" in result.output


def test_evict_writes_reason_and_timestamp(cli, synthetic: Path):
    result = cli("evict", "run_wait", "--reason", "wrong learning rate")
    assert result.exit_code == 0, result.output
    eviction = run_control.read_eviction(synthetic / "run_wait")
    assert eviction.reason == "wrong learning rate"
    assert eviction.evicted_by == "user" and eviction.evicted_at.startswith("20")


def test_evict_accepts_the_id_without_its_run_prefix(cli, synthetic: Path):
    assert cli("evict", "wait").exit_code == 0
    assert run_control.read_eviction(synthetic / "run_wait") is not None


def test_evicting_an_evicted_run_says_so_and_changes_nothing(cli, synthetic: Path):
    before = layout.evicted_path(synthetic / "run_evicted").read_text()
    result = cli("evict", "run_evicted", "--reason", "again")
    assert result.exit_code == 0
    assert "already evicted" in result.output and "reward collapsed" in result.output
    assert layout.evicted_path(synthetic / "run_evicted").read_text() == before


def test_evict_unknown_run_lists_the_candidates(cli, synthetic: Path):
    result = cli("evict", "run_nope")
    assert result.exit_code == 1
    assert "no run 'run_nope'" in result.output
    assert "run_active" in result.output and "run_wait" in result.output


def test_evict_ambiguous_run_lists_experiments_and_honours_experiment_option(
    cli, synthetic: Path, tmp_path: Path
):
    other = tmp_path / "outputs" / "other"
    make_run(other, "run_wait")
    result = cli("evict", "run_wait")
    assert result.exit_code == 1
    assert "ambiguous" in result.output and str(Path("outputs/other/run_wait")) in result.output
    assert not layout.evicted_path(synthetic / "run_wait").exists()

    result = cli("evict", "run_wait", "-e", str(other))
    assert result.exit_code == 0
    assert layout.evicted_path(other / "run_wait").exists()
    assert not layout.evicted_path(synthetic / "run_wait").exists()


def _commands(group: Any, prefix: str = "workbench") -> list[tuple[str, Any]]:
    """Every command of a Typer app's click group, by its full name (sub-apps included)."""
    found = []
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            found += _commands(command, f"{prefix} {name}")
        else:
            found.append((f"{prefix} {name}", command))
    return found


def test_the_experiment_option_is_spelled_e_and_experiment_by_every_command():
    spellings = {
        path: sorted(param.opts)
        for path, command in _commands(typer.main.get_command(app))
        for param in command.params
        if param.name == "experiment" and param.param_type_name == "option"
    }
    assert "workbench evict" in spellings and "workbench runs add" in spellings
    assert {path: opts for path, opts in spellings.items() if opts != ["--experiment", "-e"]} == {}


def test_up_with_an_invalid_recipe_exits_2_naming_file_line_and_key(cli, tmp_path: Path):
    recipe = tmp_path / "bad.toml"
    recipe.write_text('[model]\nbase = "x"\n\n[defaults]\nlr = "fast"\n')
    result = cli("up", str(recipe), "--headless")
    assert result.exit_code == 2
    assert "bad.toml, line 5" in result.output and "defaults.lr" in result.output
    assert not (tmp_path / "outputs").exists(), "nothing is written for a bad recipe"


def test_up_creates_the_experiment_with_resolved_recipe_and_run_configs(
    cli, tmp_path: Path, monkeypatch
):
    # Stand-in children (workbench/testing/standins.py): this test is about the directory.
    monkeypatch.setenv("WORKBENCH_SUPERVISOR_PLAN", standins.PLAN_REFERENCE)
    recipe = tmp_path / "r.toml"
    recipe.write_text((REPO / "recipes" / "reverse_text.toml").read_text())
    cli("up", str(recipe), "--headless", "--max-steps", "3")
    experiment = tmp_path / "outputs" / "reverse_text"
    resolved = (experiment / "recipe.toml").read_text()
    assert "max_steps = 3" in resolved and "# every run's control/orch.toml" in resolved
    for run in ("run_lr3e-3", "run_lr5e-3"):
        assert "max_steps = 3" in layout.orch_config_path(experiment / run).read_text()


def test_every_command_has_help(cli):
    for command in ("up", "status", "evict"):
        result = cli(command, "--help")
        assert result.exit_code == 0 and "Usage" in result.output
