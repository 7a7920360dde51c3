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
    repo = Path(__file__).resolve().parents[1]
    document, recipe = read_recipe(repo / "recipes" / "reverse_text.toml", max_steps=3)
    assert document["defaults"]["max_steps"] == 3
    assert all(config.max_steps == 3 for config in recipe.run_configs().values())


def test_headless_up_names_a_diverged_run_among_those_that_did_not_finish(tmp_path: Path):
    from tests.helpers import make_run
    from workbench.files import run_control
    from workbench.up import _report_outcome

    experiment = tmp_path / "outputs" / "exp"
    for run_id in ("run_done", "run_bad", "run_stuck"):
        make_run(experiment, run_id)
    run_control.mark_finished(experiment / "run_done", 30)
    why = "diverged: gradient norm nan at updates 3-5; try a lower lr in a new run"
    run_control.write_eviction(experiment / "run_bad", why, by="trainer")
    run_control.write_eviction(experiment / "run_stuck", "reward stuck", by="user")
    report, lines = collecting()
    assert _report_outcome(experiment, report) == 1
    assert f"run_bad did not finish ({why})" in lines
    assert "run_stuck did not finish (evicted: reward stuck)" in lines
