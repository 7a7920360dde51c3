"""`workbench runs fork SOURCE[@STEP] NEW`: what it writes, what it records, what it refuses.

The checkpoints here are files as the trainer and the orchestrator leave them (STABLE
parts); that a run made this way trains on from them is tests/trainer/rl/
test_run_from_checkpoint.py and tests/orchestrator/test_resume_from_checkpoint.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.config import OrchestratorConfig, load_orchestrator_config
from workbench.experiment import write_run
from workbench.files import layout
from workbench.status import RunStatus
from workbench.sweep.report import build_report
from workbench.tui.leaderboard import leaderboard_row

RECIPE = """\
[experiment]
name = "forks"
output_dir = "{output_dir}"

[model]
base = "builtin:tiny-reverse"

[defaults]
max_steps = 30
lr = 0.0003
"""


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    """run_a, 30 steps with lr 3e-3 and rank 4, keeping trainer checkpoints of steps 10,
    20 and 30 and the orchestrator's state of step 30 only (it keeps its last 2)."""
    path = tmp_path / "exp"
    path.mkdir()
    (path / "recipe.toml").write_text(RECIPE.format(output_dir=path))
    config = OrchestratorConfig(max_steps=30, lr=3e-3, lora={"rank": 4}, batch_size=32)
    run = write_run(path, "run_a", config)
    for step in (10, 20, 30):
        with layout.staged_directory(layout.checkpoint_part_dir(run, step, "trainer")) as part:
            (part / "progress.json").write_text(json.dumps({"step": step}))
    with layout.staged_directory(layout.checkpoint_part_dir(run, 30, "orchestrator")) as part:
        (part / "state.json").write_text(json.dumps({"step": 30, "data_position": 120}))
    return path


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(arg) for arg in args], catch_exceptions=False)

    return invoke


def test_a_fork_copies_the_checkpoint_keeps_the_settings_and_records_its_lineage(
    cli, experiment: Path
):
    result = cli(
        "runs", "fork", "run_a@30", "long", "--set", "max_steps=50", "--set", "lr=1e-3",
        "-e", experiment,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "forked run_a@30 into run_long" in result.output
    fork = experiment / "run_long"
    config = load_orchestrator_config(layout.orch_config_path(fork))
    assert (config.max_steps, config.lr) == (50, 1e-3)  # changed
    assert (config.lora.rank, config.batch_size) == (4, 32)  # the source's, not the recipe's
    assert config.forked_from is not None
    assert (config.forked_from.run, config.forked_from.step) == ("run_a", 30)
    for part in ("trainer", "orchestrator"):
        copied = layout.checkpoint_part_dir(fork, 30, part)
        assert layout.is_stable(copied)
    assert layout.checkpoint_steps(fork, "trainer") == [30]  # that step only
    assert not [p for p in experiment.iterdir() if p.name.startswith(".")]  # no staging left

    status = cli("status", experiment, "--json")
    runs = {run["id"]: run for run in json.loads(status.output)["runs"]}
    assert runs["run_long"]["forked_from"] == {"run": "run_a", "step": 30}
    assert runs["run_a"]["forked_from"] is None
    table = cli("status", experiment)
    assert "run_a@30" in table.output


def test_a_fork_takes_the_newest_kept_checkpoint_by_default_and_says_when_it_has_no_state(
    cli, experiment: Path
):
    # The orchestrator's state of step 20 is gone: the fork goes without it.
    result = cli("runs", "fork", "a@20", "b", "-e", experiment)
    assert result.exit_code == 0, result.output
    assert "no orchestrator state of that step" in result.output
    assert not layout.checkpoint_part_dir(experiment / "run_b", 20, "orchestrator").exists()

    newest = cli("runs", "fork", "run_a", "c", "--set", "max_steps=40", "-e", experiment)
    assert newest.exit_code == 0, newest.output
    config = load_orchestrator_config(layout.orch_config_path(experiment / "run_c"))
    assert config.forked_from is not None and config.forked_from.step == 30


def test_a_fork_of_an_unknown_run_or_step_is_refused_listing_what_there_is(cli, experiment):
    unknown = cli("runs", "fork", "run_zz", "b", "-e", experiment)
    assert unknown.exit_code == 1
    assert "no run 'run_zz'" in unknown.output and "run_a" in unknown.output

    not_kept = cli("runs", "fork", "run_a@15", "b", "-e", experiment)
    assert not_kept.exit_code == 1
    assert "keeps no checkpoint of step 15; it keeps steps 10, 20, 30" in not_kept.output

    not_a_step = cli("runs", "fork", "run_a@last", "b", "-e", experiment)
    assert not_a_step.exit_code == 2 and "must be a whole number" in not_a_step.output
    assert sorted(p.name for p in experiment.iterdir()) == ["recipe.toml", "run_a"]


def test_a_run_with_no_checkpoint_yet_cannot_be_forked(cli, experiment: Path):
    write_run(experiment, "run_new", OrchestratorConfig())
    result = cli("runs", "fork", "run_new", "b", "-e", experiment)
    assert result.exit_code == 1
    assert "run_new keeps no checkpoint yet" in result.output
    assert "checkpoint_interval (10)" in result.output


def test_a_fork_refuses_settings_the_checkpoint_cannot_go_on_with(cli, experiment: Path):
    finished = cli("runs", "fork", "run_a@30", "b", "-e", experiment)
    assert finished.exit_code == 2
    assert "max_steps = 30 leaves nothing to train after step 30" in finished.output
    assert "--set max_steps=60" in finished.output

    rank = cli("runs", "fork", "run_a@20", "b", "--set", "lora.rank=8", "-e", experiment)
    assert rank.exit_code == 2
    assert "lora.rank = 8 differs from run_a's (4" in rank.output

    bad = cli("runs", "fork", "run_a@20", "b", "--set", "lr=-1", "-e", experiment)
    assert bad.exit_code == 2 and "lr" in bad.output

    taken = cli("runs", "fork", "run_a@20", "a", "-e", experiment)
    assert taken.exit_code == 2 and "run run_a already exists" in taken.output

    lineage = cli("runs", "fork", "run_a@20", "b", "--set", "forked_from.step=3", "-e", experiment)
    assert lineage.exit_code == 2 and "forked_from is written by the fork" in lineage.output
    assert sorted(p.name for p in experiment.iterdir()) == ["recipe.toml", "run_a"]


def test_the_sweep_report_shows_a_forks_lineage_among_the_values_it_sets(cli, experiment: Path):
    assert cli("runs", "fork", "run_a@20", "b", "--set", "lr=1e-3", "-e", experiment).exit_code == 0
    report = cli("sweep", "report", experiment, "--json")
    assert report.exit_code == 0, report.output
    runs = {run["id"]: run for run in json.loads(report.output)["runs"]}
    differences = runs["run_b"]["differences"]
    assert differences["forked_from.run"] == "run_a" and differences["forked_from.step"] == 20
    assert differences["lr"] == 1e-3
    # The TUI's leaderboard (`b`) shows the same values on the run's row.
    outcome = next(run for run in build_report(experiment).runs if run.id == "run_b")
    row = leaderboard_row(outcome, RunStatus(id="run_b", status="waiting", step=0))
    assert 'forked_from.run="run_a" forked_from.step=20' in row.values


def test_a_fork_of_a_run_started_from_an_adapter_needs_the_adapter_no_more(
    cli, experiment: Path, tmp_path: Path
):
    config = OrchestratorConfig(max_steps=30, lora={"init_from": str(tmp_path / "gone")})
    source = write_run(experiment, "run_sft", config)
    with layout.staged_directory(layout.checkpoint_part_dir(source, 10, "trainer")) as part:
        (part / "progress.json").write_text(json.dumps({"step": 10}))
    result = cli("runs", "fork", "run_sft", "b", "-e", experiment)
    assert result.exit_code == 0, result.output
    fork = load_orchestrator_config(layout.orch_config_path(experiment / "run_b"))
    assert fork.lora.init_from is None  # it starts from step 10's checkpoint


def prune_while_copying(monkeypatch, run: Path, step: int, then_keep: int | None = None):
    """Make the fork's copy of `run`'s checkpoint of `step` meet the trainer's pruning: the
    step's directory goes (and, when `then_keep`, a newer checkpoint is written, as the
    trainer does before it prunes) after the copy has listed its files, before the first
    is copied. shutil's own copytree does the copying."""
    real_copytree = shutil.copytree
    pruned = []

    def copy_then_meet_pruning(src, dst, *args, **kwargs):
        def copy_file(source, destination, **options):
            if not pruned and Path(source).is_relative_to(layout.checkpoint_dir(run, step)):
                pruned.append(step)
                if then_keep is not None:
                    keep = layout.checkpoint_part_dir(run, then_keep, "trainer")
                    with layout.staged_directory(keep) as part:
                        (part / "progress.json").write_text(json.dumps({"step": then_keep}))
                shutil.rmtree(layout.checkpoint_dir(run, step))
            return shutil.copy2(source, destination, **options)

        return real_copytree(src, dst, *args, copy_function=copy_file, **kwargs)

    monkeypatch.setattr(shutil, "copytree", copy_then_meet_pruning)
    return pruned


def test_a_checkpoint_pruned_while_it_is_copied_is_said_so_and_leaves_nothing(
    cli, experiment: Path, monkeypatch
):
    pruned = prune_while_copying(monkeypatch, experiment / "run_a", 20)
    result = cli("runs", "fork", "run_a@20", "b", "-e", experiment)
    assert pruned == [20]
    assert result.exit_code == 1
    assert "checkpoint of step 20 was pruned by the trainer while it was copied" in result.output
    assert "Traceback" not in result.output and "shutil.Error" not in result.output
    assert sorted(p.name for p in experiment.iterdir()) == ["recipe.toml", "run_a"]
