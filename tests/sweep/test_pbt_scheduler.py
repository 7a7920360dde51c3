"""The supervisor's population-based training on a real experiment directory: it reads
metrics.jsonl and the kept checkpoints, writes each decision to sweep/pbt.json before
acting, forks the winner's checkpoint into the loser's place and hands the loser back to
be evicted; a restarted supervisor finishes what was decided and makes no fork twice."""

from __future__ import annotations

import json
import os
import shutil
import tomllib
from pathlib import Path

import pytest

from workbench.config import OrchestratorConfig
from workbench.experiment import write_run
from workbench.files import layout
from workbench.supervisor.fork import fork_run
from workbench.sweep.checks import Param
from workbench.sweep.files import read_pbt
from workbench.sweep.pbt_scheduler import PopulationBasedTraining, exploit_lines
from workbench.sweep.spec import PbtSpec

SPEC = PbtSpec(kind="pbt", interval=5, quantile=0.25, min_runs=3)
PARAMS = {"lr": Param("lr", ("sweep", "grid", "lr"), values=[1e-3, 3e-3, 1e-2])}
TICK = 10.0
RECIPE = """\
[experiment]
name = "pbt"
output_dir = "{output_dir}"

[model]
base = "builtin:tiny-reverse"

[defaults]
max_steps = 40
checkpoint_interval = 5
"""


def record(run: Path, step: int, value: float, at: float) -> None:
    line = {"source": "eval", "step": step, "time": at, "eval_reward_mean": value}
    with open(layout.metrics_path(run), "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")


def keep_checkpoint(run: Path, step: int) -> None:
    with layout.staged_directory(layout.checkpoint_part_dir(run, step, "trainer")) as part:
        (part / "progress.json").write_text(json.dumps({"step": step}))


@pytest.fixture
def population(experiment: Path) -> dict[str, Path]:
    """Four runs at step 5: run_a ahead (keeping checkpoints 5 and 10), run_d behind."""
    (experiment / "recipe.toml").write_text(RECIPE.format(output_dir=experiment))
    runs = {}
    for i, (name, lr, value) in enumerate(
        [("run_a", 3e-3, 0.8), ("run_b", 1e-3, 0.75), ("run_c", 1e-2, 0.7), ("run_d", 3e-2, 0.4)]
    ):
        config = OrchestratorConfig(max_steps=40, lr=lr, checkpoint_interval=5)
        runs[name] = write_run(experiment, name, config)
        os.utime(layout.orch_config_path(runs[name]), ns=(i * 10**9, i * 10**9))
        record(runs[name], 0, 0.6, at=1.0)
        record(runs[name], 5, value, at=10.0 + i)
    keep_checkpoint(runs["run_a"], 5)
    keep_checkpoint(runs["run_a"], 10)
    return runs


def test_the_loser_is_forked_from_the_winner_into_its_place_and_handed_back(
    experiment: Path, population: dict[str, Path]
):
    scheduler = PopulationBasedTraining(experiment, SPEC, PARAMS, fork=fork_run)
    [eviction] = scheduler.poll(TICK)
    assert eviction.run_id == "run_d" and eviction.rung == 5
    assert eviction.reason.startswith(
        "pbt step 5: eval_reward_mean 0.4, rank 4/4, in the bottom quantile: run_a@10 "
        "(eval_reward_mean 0.8) goes on as run_d-pbt1 with lr 0.003 -> "
    )
    fork = experiment / "run_d-pbt1"
    config = tomllib.loads(layout.orch_config_path(fork).read_text())
    assert config["forked_from"] == {"run": "run_a", "step": 10}
    saved = read_pbt(experiment)
    assert saved is not None
    [exploit] = [d for d in saved.decisions if d.decision == "exploit"]
    assert config["lr"] == exploit.changes["lr"][1] != 3e-3
    assert layout.checkpoint_steps(fork, "trainer") == [10]
    # The trainer admits the oldest orch.toml first: the fork queues where run_d was.
    assert (
        layout.orch_config_path(fork).stat().st_mtime_ns
        == layout.orch_config_path(population["run_d"]).stat().st_mtime_ns
    )
    assert saved.actions == {("run_d", 5): "forked"}
    scheduler.evicted(eviction)
    assert read_pbt(experiment).actions == {("run_d", 5): "evicted"}  # type: ignore[union-attr]
    [line] = exploit_lines(experiment)
    assert line.startswith("run_d: pbt step 5:") and line.endswith("[evicted]")


def test_a_restarted_supervisor_evicts_what_was_decided_and_forks_nothing_twice(
    experiment: Path, population: dict[str, Path]
):
    PopulationBasedTraining(experiment, SPEC, PARAMS, fork=fork_run).poll(
        TICK
    )  # died before evicting
    fork = layout.orch_config_path(experiment / "run_d-pbt1")
    written = fork.read_text()
    again = PopulationBasedTraining(experiment, SPEC, PARAMS, fork=fork_run)
    [eviction] = again.poll(TICK)
    assert eviction.run_id == "run_d"
    assert fork.read_text() == written
    assert [p.name for p in layout.list_run_dirs(experiment)].count("run_d-pbt1") == 1
    assert [d.decision for d in again.record.decisions].count("exploit") == 1


def test_without_a_checkpoint_to_take_the_loser_goes_on(
    experiment: Path, population: dict[str, Path]
):
    for step in (5, 10):
        stable = layout.checkpoint_part_dir(population["run_a"], step, "trainer") / layout.STABLE
        stable.unlink()  # not written yet, or pruned
    assert PopulationBasedTraining(experiment, SPEC, PARAMS, fork=fork_run).poll(TICK) == []
    saved = read_pbt(experiment)
    assert saved is not None
    assert [d.decision for d in saved.decisions][-1] == "no_source"
    assert not (experiment / "run_d-pbt1").exists()


def test_a_fork_that_cannot_be_made_is_written_down_with_why_and_the_loser_goes_on(
    experiment: Path, population: dict[str, Path]
):
    # A perturbed max_steps of 5 leaves nothing to train after the checkpoint of step 10.
    params = {"max_steps": Param("max_steps", ("sweep", "grid", "max_steps"), values=[5])}
    assert PopulationBasedTraining(experiment, SPEC, params, fork=fork_run).poll(TICK) == []
    saved = read_pbt(experiment)
    assert saved is not None
    action = saved.actions[("run_d", 5)]
    assert action.startswith("fork failed: ") and "max_steps = 5 leaves nothing" in action
    assert not (experiment / "run_d-pbt1").exists()


# ---------------------------------------------------------------- a real run, replayed

REAL = Path(__file__).with_name("data") / "pbt_e2e"


def test_the_records_of_a_real_pbt_run_replayed_give_the_decisions_it_made(experiment: Path):
    """`tests/sweep/data/pbt_e2e`: the files tests/e2e/test_pbt_e2e.py's experiment left (the
    recipe, both runs' metrics.jsonl and orch.toml, sweep/pbt.json as the supervisor wrote
    it; the fork it made is left out, as it was not there when PBT decided). Read again
    from the files, with the winner's checkpoint of step 3 kept, PBT decides the same."""
    recorded = json.loads((REAL / "pbt.json").read_text())
    shutil.copy(REAL / "recipe.toml", experiment / "recipe.toml")
    for run_id in ("run_lr5e-3", "run_lr1e-6"):
        shutil.copytree(REAL / run_id, experiment / run_id)
    keep_checkpoint(experiment / "run_lr5e-3", 3)
    spec = PbtSpec.model_validate(recorded["spec"])

    scheduler = PopulationBasedTraining.for_experiment(experiment, spec, fork_run)
    [eviction] = scheduler.poll(TICK)

    replayed = [decision.to_json() for decision in scheduler.record.decisions]
    assert replayed == [
        {key: value for key, value in decision.items() if key != "action"}
        for decision in recorded["decisions"]
    ]
    assert eviction.run_id == "run_lr1e-6"
    assert eviction.reason == (
        "pbt step 3: eval_reward_mean 0.6073, rank 2/2, in the bottom quantile: "
        "run_lr5e-3@3 (eval_reward_mean 0.8118) goes on as run_lr1e-6-pbt1 with lr 0.005 -> 0.004"
    )


def test_a_source_checkpoint_pruned_while_it_is_copied_is_forked_at_its_newest_instead(
    experiment: Path, population: dict[str, Path], monkeypatch
):
    from tests.commands.test_fork import prune_while_copying

    # While run_d's fork copies run_a's step 10, run_a saves step 15 and prunes step 10.
    pruned = prune_while_copying(monkeypatch, population["run_a"], 10, then_keep=15)
    [eviction] = PopulationBasedTraining(experiment, SPEC, PARAMS, fork=fork_run).poll(TICK)
    assert pruned == [10] and eviction.run_id == "run_d"
    config = tomllib.loads(layout.orch_config_path(experiment / "run_d-pbt1").read_text())
    assert config["forked_from"] == {"run": "run_a", "step": 15}
    assert read_pbt(experiment).actions == {("run_d", 5): "forked"}  # type: ignore[union-attr]
