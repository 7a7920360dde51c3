"""`lora.init_from` checked before launch: `workbench up` and `workbench runs add` refuse an
adapter that is not one, or does not fit the base model or the rank, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.config import LORA_TARGET_MODULES, load_orchestrator_config
from workbench.files import layout
from workbench.trainer.runs.broadcast import write_adapter

BASE = "builtin:tiny-reverse"
RECIPE = """\
[experiment]
name = "adapters"
output_dir = "{output_dir}"

[model]
base = "builtin:tiny-reverse"

[defaults]
max_steps = 5
{defaults}

[[runs]]
id = "a"
"""


def adapter(directory: Path, *, rank: int = 8, base: str = BASE) -> Path:
    """The files of an adapter directory as workbench writes them; the weights are not
    read before launch, so none are needed here."""
    return write_adapter(
        directory,
        {},
        rank=rank,
        alpha=16,
        target_modules=list(LORA_TARGET_MODULES),
        base_model=base,
    )


@pytest.fixture
def cli(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(arg) for arg in args], catch_exceptions=False)

    return invoke


def recipe(tmp_path: Path, defaults: str = "") -> Path:
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE.format(output_dir=tmp_path / "exp", defaults=defaults))
    return path


def test_up_refuses_an_init_from_that_does_not_fit_before_anything_starts(cli, tmp_path):
    wide = adapter(tmp_path / "r16", rank=16)
    result = cli("up", recipe(tmp_path, f'lora = {{ init_from = "{wide}" }}'), "--dry-run")
    assert result.exit_code == 2, result.output
    assert (
        "lora.init_from" in result.output and "has rank 16, more than this run's 8" in result.output
    )
    assert not (tmp_path / "exp").exists()

    other = adapter(tmp_path / "other", base="builtin:tiny-reverse-chat")
    result = cli("up", recipe(tmp_path, f'lora = {{ init_from = "{other}" }}'), "--dry-run")
    assert result.exit_code == 2
    assert "is an adapter of builtin:tiny-reverse-chat, not of this experiment's" in result.output


def test_runs_add_takes_a_fitting_adapter_by_relative_path_and_refuses_a_missing_one(cli, tmp_path):
    adapter(tmp_path / "sft-out")
    assert cli("up", recipe(tmp_path), "--dry-run").exit_code == 0
    # The experiment as `up` leaves it, without starting anything.
    experiment = tmp_path / "exp"
    experiment.mkdir()
    layout.recipe_path(experiment).write_text(recipe(tmp_path).read_text())

    missing = cli("runs", "add", "b", "--set", "lora.init_from=nowhere", "-e", experiment)
    assert missing.exit_code == 2
    assert "lora.init_from" in missing.output and "nowhere is not a directory" in missing.output

    added = cli("runs", "add", "b", "--set", "lora.init_from=sft-out", "-e", experiment)
    assert added.exit_code == 0, added.output
    config = load_orchestrator_config(layout.orch_config_path(experiment / "run_b"))
    assert config.lora.init_from == str(tmp_path / "sft-out")  # absolute for the trainer


def test_the_shipped_sft_then_rl_recipe_needs_the_sft_adapter_first_and_then_passes(cli, tmp_path):
    shipped = Path(__file__).parents[2] / "recipes" / "sft_then_rl.toml"
    before = cli("up", shipped, "--dry-run")
    assert before.exit_code == 2
    assert (
        "runs[0].lora.init_from" in before.output
        and "sft-reverse is not a directory" in before.output
    )
    adapter(tmp_path / "outputs" / "sft-reverse")  # what `workbench sft --lora -o` leaves
    after = cli("up", shipped, "--dry-run")
    assert after.exit_code == 0, after.output
    assert "run_from_sft" in after.output and "run_scratch" in after.output
