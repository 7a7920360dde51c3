"""The `workbench up` flow on its own, without the CLI around it."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.up import RecipeError, Report, launch_experiment, read_recipe


def collecting() -> tuple[Report, list[str]]:
    lines: list[str] = []
    return Report(say=lines.append, warn=lines.append), lines


def test_a_missing_recipe_is_bad_input_naming_the_path(tmp_path: Path):
    with pytest.raises(RecipeError, match=r"nope\.toml: file not found"):
        read_recipe(tmp_path / "nope.toml")


def test_an_invalid_recipe_stops_the_flow_before_anything_is_written_or_said(tmp_path: Path):
    recipe = tmp_path / "bad.toml"
    recipe.write_text('[model]\nbase = "x"\n\n[defaults]\nlr = "fast"\n')
    report, lines = collecting()
    with pytest.raises(RecipeError, match=r"bad\.toml, line 5") as raised:
        launch_experiment(recipe, report, headless=True)
    assert "defaults.lr" in str(raised.value)
    assert lines == [] and not (tmp_path / "outputs").exists()


def test_max_steps_overrides_the_defaults_of_every_run(tmp_path: Path):
    repo = Path(__file__).resolve().parents[2]
    document, recipe = read_recipe(repo / "recipes" / "reverse_text.toml", max_steps=3)
    assert document["defaults"]["max_steps"] == 3
    assert all(config.max_steps == 3 for config in recipe.run_configs().values())
