"""`workbench samples --compare RUN...`: runs side by side on one held-out eval's prompts.

The eval records are written by the real evaluator (`PolicyEvaluator` in an orchestrator)
against the scripted stand-in for the inference server (tests/orchestrator/scripted.py),
each run's stand-in answering differently, so each column is known.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import make_run
from tests.orchestrator.scripted import ScriptedChat, make_orchestrator, publish_adapter
from workbench.cli import app
from workbench.files.eval_samples import read_evals

EVAL = {"interval": 2, "num_prompts": 3}
ORCH_TOML = "[eval]\ninterval = 2\nnum_prompts = 3\n"


def train_with_evals(run: Path, chat: ScriptedChat, max_steps: int) -> None:
    """A whole run with its evals, as its orchestrator does it: versions 0, 2, ... and the last."""
    orchestrator = make_orchestrator(run, chat, max_steps=max_steps, eval=EVAL)
    for version in range(max_steps):
        if version:
            publish_adapter(run, version)
        orchestrator.step_once()
    publish_adapter(run, max_steps)
    orchestrator.run_until_done()


# The first completion of a prompt is the eval's (greedy: one); training's groups need
# rewards that differ, which the others give.
def whole(prompt: str, i: int) -> str:
    return prompt[::-1][: len(prompt) - i]  # the eval's: the right answer, reward 1


def first_letter(prompt: str, i: int) -> str:
    return prompt[::-1][: i + 1]  # the eval's: one letter


@pytest.fixture(scope="module")
def experiments(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """exp1: run_a (evals 0, 2, 4, 5) answers right, run_b (evals 0, 2, 3) one letter;
    exp2: run_c on the same environment; exp3: run_d on another (no evals needed)."""
    root = tmp_path_factory.mktemp("side")
    paths = {name: root / name for name in ("exp1", "exp2", "exp3")}
    for path in paths.values():
        path.mkdir()
        (path / "recipe.toml").write_text('[model]\nbase = "builtin:tiny-reverse"\n')
    train_with_evals(make_run(paths["exp1"], "run_a", ORCH_TOML), ScriptedChat(whole), 5)
    train_with_evals(make_run(paths["exp1"], "run_b", ORCH_TOML), ScriptedChat(first_letter), 3)
    train_with_evals(make_run(paths["exp2"], "run_c", ORCH_TOML), ScriptedChat(whole), 2)
    make_run(paths["exp3"], "run_d", 'env = "reverse_text"\nenv_args = { max_length = 8 }\n')
    return paths


def samples(*args: object):
    return CliRunner().invoke(app, ["samples", *map(str, args)], catch_exceptions=False)


def test_each_prompt_of_the_newest_shared_eval_step_with_every_runs_completion_and_reward(
    experiments: dict[str, Path],
):
    exp1 = experiments["exp1"]
    result = samples("--compare", "run_a", "run_b", "-e", exp1, "--json")
    assert result.exit_code == 0, result.output
    compared = json.loads(result.stdout)
    assert compared["step"] == 2  # run_b's evals stop at 3: 2 is the newest both have
    assert [r["label"] for r in compared["runs"]] == ["run_a", "run_b"]
    assert [r["adapter"] for r in compared["runs"]] == ["run_a@step2", "run_b@step2"]
    (kept,) = [e for e in read_evals(exp1 / "run_a") if e.policy_version == 2]
    assert [p["prompt"] for p in compared["prompts"]] == [p.prompt for p in kept.prompts]
    for row in compared["prompts"]:
        a, b = row["runs"]["run_a"], row["runs"]["run_b"]
        assert a["completions"][0]["text"] == row["prompt"][::-1] == row["answer"]
        assert b["completions"][0]["text"] == row["prompt"][-1]
        assert a["reward"] == 1.0 and b["reward"] < 1.0


def test_the_table_has_a_column_per_run_and_a_row_per_prompt(experiments: dict[str, Path]):
    result = samples("--compare", "run_a", "run_b", "-e", experiments["exp1"], "--step", "0")
    assert result.exit_code == 0, result.output
    assert "held-out eval of step 0" in result.stdout
    header = next(line for line in result.stdout.splitlines() if "run_a" in line)
    assert header.index("run_a") < header.index("run_b")  # then each run's mean reward
    assert "mean 1.000" in result.stdout  # run_a answers right
    prompts = read_evals(experiments["exp1"] / "run_a")[0].prompts  # step 0
    for prompt in prompts:
        line = next(line for line in result.stdout.splitlines() if prompt.prompt in line)
        assert f"1.00 {prompt.prompt[::-1]!r}" in line  # run_a's cell, then run_b's
        assert line.index(f"{prompt.prompt[::-1]!r}") < line.index(f"{prompt.prompt[-1]!r}")


def test_a_step_not_every_run_evaluated_is_refused_listing_the_steps_kept(
    experiments: dict[str, Path],
):
    result = samples("--compare", "run_a", "run_b", "-e", experiments["exp1"], "--step", "4")
    assert result.exit_code == 1
    assert "not every run has a held-out eval of step 4" in result.stderr
    assert "run_a: 0, 2, 4, 5; run_b: 0, 2, 3" in result.stderr


def test_runs_of_two_experiments_on_one_environment_compare_by_experiment_and_run(
    experiments: dict[str, Path],
):
    exp1, exp2 = experiments["exp1"], experiments["exp2"]
    result = samples("--compare", f"{exp1}/run_b", f"{exp2}/run_c", "--json")
    assert result.exit_code == 0, result.output
    compared = json.loads(result.stdout)
    assert [r["label"] for r in compared["runs"]] == ["exp1/run_b", "exp2/run_c"]
    assert compared["step"] == 2  # run_c: 0, 2 (its last)


def test_runs_on_different_environments_are_refused_naming_the_difference(
    experiments: dict[str, Path],
):
    exp1, exp3 = experiments["exp1"], experiments["exp3"]
    result = samples("--compare", f"{exp1}/run_a", f"{exp3}/run_d")
    assert result.exit_code == 1
    assert "exp1/run_a and exp3/run_d train on different environments" in result.stderr
    assert "env_args {} and {'max_length': 8}" in result.stderr


def test_unknown_runs_are_named_and_several_runs_without_compare_are_refused(
    experiments: dict[str, Path],
):
    result = samples("--compare", "run_a", "run_zz", "-e", experiments["exp1"])
    assert result.exit_code == 1 and "no run 'run_zz'" in result.stderr
    result = samples("run_a", "run_b", "-e", experiments["exp1"])
    assert result.exit_code == 2 and "add --compare" in result.stderr
