"""The example per-process configs under configs/ stay valid and say what they claim."""

from __future__ import annotations

from pathlib import Path

import tomlkit
from typer.testing import CliRunner

from workbench.cli import app
from workbench.config import (
    deep_merge,
    load_inference_config,
    load_orchestrator_config,
    load_trainer_config,
    read_toml,
)
from workbench.experiment import create_experiment
from workbench.files import layout
from workbench.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
RECIPE = REPO / "recipes" / "reverse_text.toml"


def experiment_from_the_recipe(tmp_path: Path) -> Path:
    """recipes/reverse_text.toml's experiment, created (nothing started) under tmp_path."""
    document = tomlkit.parse(RECIPE.read_text())
    document["experiment"]["output_dir"] = str(tmp_path / "exp")
    path = tmp_path / "recipe.toml"
    path.write_text(tomlkit.dumps(document))
    return create_experiment(load_recipe(path), document)


def runs_add(*args: str):
    return CliRunner().invoke(app, ["runs", "add", *args], catch_exceptions=False)


def test_the_trainer_config_is_what_the_supervisor_writes_for_the_reverse_text_recipe():
    assert load_trainer_config(CONFIGS / "trainer.toml") == load_recipe(RECIPE).trainer_config()


def test_the_inference_config_is_what_the_supervisor_writes_for_the_recipe_with_a_fixed_port():
    example = load_inference_config(CONFIGS / "inference.toml")
    written = load_recipe(RECIPE).inference_config()
    assert example.inference.port != 0, "inference started alone refuses port 0"
    written.inference.port = example.inference.port
    assert example == written


def test_the_example_orch_toml_is_a_valid_run_config_on_its_own():
    config = load_orchestrator_config(CONFIGS / "orch.toml")
    assert config.lr == 1e-2 and config.scheduler.kind == "cosine"


def test_runs_add_from_the_example_orch_toml_layers_recipe_defaults_file_and_set(tmp_path: Path):
    experiment = experiment_from_the_recipe(tmp_path)
    result = runs_add(
        "lr1e-2", "--from", str(CONFIGS / "orch.toml"), "--set", "max_steps=12",
        "-e", str(experiment),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    written = load_orchestrator_config(layout.orch_config_path(experiment / "run_lr1e-2"))
    recipe_defaults = load_recipe(RECIPE).defaults.model_dump(mode="json")
    file_keys = read_toml(CONFIGS / "orch.toml")[0].unwrap()
    expected = deep_merge(deep_merge(recipe_defaults, file_keys), {"max_steps": 12})
    assert written.model_dump(mode="json") == expected
    assert written.env_args == {"min_length": 9, "max_length": 9}, "the recipe's, not built-in"
    assert written.sampling.temperature == 0.8 and written.max_steps == 12


def test_runs_add_from_a_bad_file_exits_2_naming_the_file_and_writes_nothing(tmp_path: Path):
    experiment = experiment_from_the_recipe(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text("lr = 1e-3\n[sampling\n")
    missing = runs_add("x", "--from", str(tmp_path / "nope.toml"), "-e", str(experiment))
    broken = runs_add("x", "--from", str(bad), "-e", str(experiment))
    bad.write_text("lr = 1e-3\nlearning_rate = 1\n")
    unknown = runs_add("x", "--from", str(bad), "-e", str(experiment))
    bad.write_text("lr = 1e-3\n[sampling]\ntemperature = -1\n")
    bad_value = runs_add("x", "--from", str(bad), "-e", str(experiment))
    assert [r.exit_code for r in (missing, broken, unknown, bad_value)] == [2, 2, 2, 2]
    assert "nope.toml" in missing.output and "file not found" in missing.output
    assert "bad.toml, line 2" in broken.output
    assert "bad.toml, line 2: learning_rate: unknown key" in unknown.output
    assert "bad.toml, line 3: sampling.temperature:" in bad_value.output
    assert not (experiment / "run_x").exists()


def test_runs_add_from_a_file_with_some_keys_takes_the_rest_from_the_recipe(tmp_path: Path):
    experiment = experiment_from_the_recipe(tmp_path)
    partial = tmp_path / "partial.toml"
    partial.write_text("max_steps = 3\n")
    assert runs_add("y", "--from", str(partial), "-e", str(experiment)).exit_code == 0
    written = load_orchestrator_config(layout.orch_config_path(experiment / "run_y"))
    assert written.max_steps == 3 and written.env_args == {"min_length": 9, "max_length": 9}
