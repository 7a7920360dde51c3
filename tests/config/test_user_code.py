"""A loss and an environment of the user's, named `package.module:function` and
`package.module:Class`, import from where the docs say (the directory `workbench` runs in)
through the installed `workbench` command, whose own path starts with the venv's bin
directory rather than that directory: its check before launch, the orchestrator and the
trainer under torchrun all find them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.files import run_control
from workbench.files.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
# The installed console script, as a user runs it (not `python -m`, not pytest's path).
WORKBENCH = str(Path(sys.executable).parent / "workbench")
LOSS = "my_pkg.my_loss:scaled_reinforce"
ENV = "my_pkg.my_env:ShortReverse"

MY_LOSS = """\
import torch

from workbench.trainer.losses import LossInputs, TokenLoss


def scaled_reinforce(inputs: LossInputs) -> TokenLoss:
    logprobs = torch.where(inputs.loss_mask, inputs.logprobs, 0.0)
    return TokenLoss(-inputs.advantages * logprobs)
"""
MY_ENV = """\
from workbench.envs.reverse_text import ReverseText


class ShortReverse(ReverseText):
    name = "short_reverse"
"""
RECIPE = f"""\
[experiment]
name = "mine"
output_dir = "outputs/mine"
[model]
base = "builtin:tiny-reverse"
[trainer]
max_concurrent_runs = 1
[defaults]
env = "{ENV}"
env_args = {{ min_length = 4, max_length = 4 }}
batch_size = 16
rollouts_per_prompt = 4
max_steps = 1
loss = {{ kind = "{LOSS}" }}
[[runs]]
id = "a"
"""


def user_project(root: Path) -> Path:
    """A directory with the user's package and, beside it, a recipe naming its loss and
    environment; returns the recipe."""
    package = root / "my_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "my_loss.py").write_text(MY_LOSS)
    (package / "my_env.py").write_text(MY_ENV)
    recipe = root / "recipe.toml"
    recipe.write_text(RECIPE)
    return recipe


def workbench(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    # This checkout's workbench, and nothing else: no '' entry putting the cwd on the path.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [WORKBENCH, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def test_the_installed_command_imports_the_users_loss_and_environment_from_its_directory(
    tmp_path: Path,
):
    project = tmp_path / "project"
    recipe = user_project(project)
    result = workbench("up", str(recipe), "--dry-run", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "nothing was written or started" in result.stdout


@pytest.mark.parametrize("missing", ["loss", "environment"])
def test_a_module_not_where_the_docs_say_is_refused_naming_where_it_was_looked_for(
    tmp_path: Path, missing: str
):
    recipe = user_project(tmp_path / "project")
    if missing == "environment":  # the loss found (installed), the environment not
        recipe.write_text(RECIPE.replace(LOSS, "tests.trainer.custom_loss:scaled_reinforce"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = workbench("up", str(recipe), "--dry-run", cwd=elsewhere)
    assert result.returncode == 2, result.stdout
    module = "my_pkg.my_loss" if missing == "loss" else "my_pkg.my_env"
    assert f"cannot import module {module!r} (No module named 'my_pkg')" in result.stderr
    assert f"the directory workbench runs in ({elsewhere})" in result.stderr
    assert "PYTHONPATH" in result.stderr
    assert not (elsewhere / "outputs").exists() and not (recipe.parent / "outputs").exists()


@pytest.mark.slow
def test_the_orchestrator_and_the_trainer_started_by_the_command_import_them_too(
    tmp_path: Path,
):
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]')")
    project = tmp_path / "project"
    recipe = user_project(project)
    experiment = project / "outputs" / "mine"
    try:
        result = workbench("up", str(recipe), "--headless", cwd=project, timeout=10 * 60)
    finally:
        if (experiment / "supervisor").exists():
            workbench("down", str(experiment), cwd=project, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = experiment / "run_a"
    assert run_control.is_finished(run)
    # The orchestrator sampled the user's environment, the trainer trained with the loss.
    assert [m["step"] for m in read_metrics(run, "orchestrator") if m.get("written", True)]
    assert {m["loss_kind"] for m in read_metrics(run, "trainer")} == {LOSS}
