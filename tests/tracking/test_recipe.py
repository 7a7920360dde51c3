"""The recipe's `[tracking]` table: checked before anything starts, defaults resolved."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.config import ConfigError
from workbench.recipe import load_recipe
from workbench.tracking import TrackingTarget

RECIPE = """\
[experiment]
name = "tracked"
output_dir = "{output_dir}"

[model]
base = "builtin:tiny-reverse"

[tracking]
{tracking}

[[runs]]
id = "a"
"""


def write_recipe(tmp_path: Path, tracking: str) -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE.format(output_dir=tmp_path / "out", tracking=tracking))
    return path


def test_a_backend_whose_library_is_missing_stops_up_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *rest: None if name == "wandb" else find_spec(name, *rest),
    )
    recipe = write_recipe(tmp_path, 'backend = "wandb"')
    result = CliRunner().invoke(app, ["up", str(recipe), "--headless"])
    assert result.exit_code == 2
    output = " ".join(result.output.split())
    assert f"{recipe}, line 9: tracking.backend: wandb is not installed" in output
    assert "pip install wandb" in output
    assert not (tmp_path / "out").exists()


def test_a_wandb_option_under_trackio_is_an_error_at_its_key(tmp_path: Path):
    recipe = write_recipe(tmp_path, 'backend = "trackio"\nentity = "team"')
    with pytest.raises(ConfigError) as caught:
        load_recipe(recipe)
    assert str(caught.value) == (
        f'{recipe}, line 10: tracking.entity: applies to backend = "wandb" only (backend is '
        "'trackio'): remove it or switch the backend"
    )


def test_wandb_options_may_stay_while_tracking_is_off(tmp_path: Path):
    recipe = load_recipe(write_recipe(tmp_path, 'backend = "none"\nmode = "online"'))
    assert TrackingTarget.from_recipe(recipe) is None


def test_the_project_defaults_to_the_experiment_and_dir_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(write_recipe(tmp_path, 'backend = "wandb"\ndir = "runs"'))
    target = TrackingTarget.from_recipe(recipe)
    assert target == TrackingTarget(
        backend="wandb", project="tracked", experiment="tracked", dir=tmp_path / "runs"
    )
    assert target.tracker_run_name("run_a") == "run_a"


def test_runs_of_a_shared_project_are_named_after_their_experiment_too(tmp_path: Path):
    recipe = load_recipe(write_recipe(tmp_path, 'backend = "trackio"\nproject = "shared"'))
    assert TrackingTarget.from_recipe(recipe).tracker_run_name("run_a") == "tracked-run_a"
