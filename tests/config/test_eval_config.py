"""The `eval` table of a run's config: defaults, recipe merging, `runs add --set`, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.config import ConfigError, OrchestratorConfig, load_orchestrator_config
from workbench.files import layout
from workbench.recipe import load_recipe

RECIPE = """\
[model]
base = "builtin:tiny-reverse"

[defaults]
sampling = { max_tokens = 48 }
eval = { interval = 5, num_prompts = 16 }

[[runs]]
id = "a"

[[runs]]
id = "b"
eval = { interval = 2, sampling = { temperature = 0.7 } }
"""


def write(tmp_path: Path, text: str, name: str = "recipe.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_by_default_a_run_is_scored_greedily_every_10_versions_on_32_prompts():
    config = OrchestratorConfig()
    assert config.eval.interval == 10 and config.eval.num_prompts == 32
    assert config.eval.rollouts_per_prompt == 1 and config.eval.sampling.temperature == 0.0
    assert config.eval.sampling.max_tokens is None  # the run's sampling.max_tokens


def test_a_runs_eval_table_merges_key_by_key_with_the_defaults(tmp_path: Path):
    configs = load_recipe(write(tmp_path, RECIPE)).run_configs()
    assert (configs["run_a"].eval.interval, configs["run_a"].eval.num_prompts) == (5, 16)
    assert (configs["run_b"].eval.interval, configs["run_b"].eval.num_prompts) == (2, 16)
    assert configs["run_b"].eval.sampling.temperature == 0.7


def test_a_bad_eval_value_names_the_file_line_and_key(tmp_path: Path):
    path = write(tmp_path, RECIPE.replace("interval = 5", "interval = -1"))
    with pytest.raises(ConfigError) as info:
        load_recipe(path)
    problem = next(p for p in info.value.problems if p.key == "defaults.eval.interval")
    assert problem.line == 6 and "greater than or equal to 0" in problem.message
    assert str(path) in str(info.value)


def test_a_misspelt_eval_sampling_key_suggests_the_right_one(tmp_path: Path):
    path = write(tmp_path, "[eval.sampling]\ntemprature = 0.5\n", "orch.toml")
    with pytest.raises(ConfigError) as info:
        load_orchestrator_config(path)
    (problem,) = info.value.problems
    assert problem.key == "eval.sampling.temprature" and problem.line == 2
    assert "did you mean 'temperature'" in problem.message


def test_several_greedy_eval_rollouts_are_refused_as_the_same_completion_repeated(
    tmp_path: Path,
):
    path = write(
        tmp_path, RECIPE.replace('id = "a"', 'id = "a"\neval = { rollouts_per_prompt = 4 }')
    )
    with pytest.raises(ConfigError, match=r"runs\[0\]\.eval: rollouts_per_prompt = 4 with "):
        load_recipe(path)
    sampled = RECIPE.replace(
        'id = "a"', 'id = "a"\neval = { rollouts_per_prompt = 4, sampling = { temperature = 0.5 } }'
    )
    assert (
        load_recipe(write(tmp_path, sampled)).run_configs()["run_a"].eval.rollouts_per_prompt == 4
    )


def test_runs_add_set_eval_interval_writes_it_into_the_new_runs_config(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    experiment = tmp_path / "outputs" / "exp"
    experiment.mkdir(parents=True)
    write(experiment, RECIPE)
    result = CliRunner().invoke(
        app, ["runs", "add", "c", "--set", "eval.interval=3", "-e", str(experiment)]
    )
    assert result.exit_code == 0, result.output
    config = load_orchestrator_config(layout.orch_config_path(experiment / "run_c"))
    assert (config.eval.interval, config.eval.num_prompts) == (3, 16)
    bad = CliRunner().invoke(
        app, ["runs", "add", "d", "--set", "eval.num_prompts=0", "-e", str(experiment)]
    )
    assert bad.exit_code == 2 and "eval.num_prompts" in bad.output
