"""`workbench export`: a run's best or latest kept adapter, in a directory of its own with a
model card, loadable with peft alone; refusals that name the run and leave nothing behind."""

from __future__ import annotations

import ast
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.export.harness import BASE, STEPS, TrainedRun, logits_without_workbench
from tests.helpers import make_run
from workbench.cli import app
from workbench.export import ExportError, export_adapter
from workbench.files import layout, run_control
from workbench.files.metrics import append_metrics
from workbench.models import resolve_model


def record_evals(run: Path, rewards: dict[int, float]) -> None:
    for step, reward in rewards.items():
        append_metrics(run, "eval", step, policy_version=step, eval_reward_mean=reward)


def card_snippet(card: str) -> str:
    """The Python block of a model card: how it tells a user to load the adapter."""
    return re.search(r"```python\n(.*?)```", card, re.S).group(1)


def test_best_is_the_best_evaluated_adapter_even_one_kept_only_as_a_checkpoint(
    trained: TrainedRun, experiment_copy: Path, tmp_path: Path
):
    run = experiment_copy / "run_a"
    # Step 2 scored best; the trainer keeps it only as checkpoints/step_2/trainer.
    record_evals(run, {0: 0.2, 2: 0.9, 4: 0.5, STEPS: 0.6})
    run_control.mark_finished(run, STEPS)
    assert not layout.broadcast_dir(run, 2).exists()
    exported = export_adapter(run, tmp_path / "out")

    assert (exported.choice.adapter.step, exported.choice.adapter.kind) == (2, "checkpoint")
    assert "eval_reward_mean 0.900 at step 2" in exported.choice.note
    card = (tmp_path / "out" / "README.md").read_text()
    # The card's own loading instructions, run where workbench cannot be imported, give the
    # trainer's outputs after step 2.
    theirs = logits_without_workbench(tmp_path, card_snippet(card))
    assert not torch.allclose(trained.logits[2], trained.logits[STEPS], atol=1e-4)
    torch.testing.assert_close(theirs, trained.logits[2], rtol=1e-5, atol=1e-5)
    assert f"base_model: {resolve_model(BASE)}" in card and f"`{BASE}`" in card
    assert f"Steps trained: {STEPS} of {STEPS} (finished)" in card
    assert "0.200 (step 0), 0.900 (step 2), 0.500 (step 4), 0.600 (step 5)" in card
    assert "| `lr` | 0.05 |" in card and "| `checkpoint_interval` | 2 |" in card
    assert f"--model {resolve_model(BASE)} --enable-lora --lora-modules run_a=" in card


@pytest.mark.parametrize(
    ("evals", "chosen", "said"),
    [
        ({0: 0.95, 2: 0.9, STEPS: 0.6}, 2, "the base model scored 0.950 (step 0)"),
        ({1: 0.99, 4: 0.5, STEPS: 0.4}, 4, "an adapter no longer kept scored 0.990 (step 1)"),
    ],
)
def test_best_says_when_a_better_score_is_not_among_the_kept_adapters(
    experiment_copy: Path, tmp_path: Path, evals: dict[int, float], chosen: int, said: str
):
    run = experiment_copy / "run_a"
    record_evals(run, evals)
    choice = export_adapter(run, tmp_path / "out").choice
    assert choice.adapter.step == chosen and said in choice.note


def test_latest_copies_the_newest_complete_broadcast_whole(experiment_copy: Path, tmp_path):
    run = experiment_copy / "run_a"
    source = layout.broadcast_dir(run, STEPS)
    # The trainer is writing the next one: every file there but its STABLE marker.
    unfinished = shutil.copytree(source, layout.broadcast_dir(run, STEPS + 1))
    (unfinished / layout.STABLE).unlink()
    exported = export_adapter(run, tmp_path / "out", "latest")
    assert (exported.choice.adapter.step, exported.choice.adapter.kind) == (STEPS, "broadcast")
    for name in ("adapter_config.json", "adapter_model.safetensors", "workbench.json"):
        assert (tmp_path / "out" / name).read_bytes() == (source / name).read_bytes()
    assert layout.is_stable(tmp_path / "out"), "written whole, its marker last"


def test_without_evals_best_goes_by_the_training_reward_of_each_adapters_rollouts(
    experiment_copy: Path, tmp_path: Path
):
    run = experiment_copy / "run_a"
    for step, version, reward in [(3, 2, 0.9), (4, 3, 0.4), (5, 4, 0.7), (6, 4, 0.8)]:
        append_metrics(run, "orchestrator", step, policy_version=version, reward_mean=reward)
    choice = export_adapter(run, tmp_path / "out").choice
    assert choice.adapter.step == 2 and choice.metric == "reward_mean"
    assert "0.900 at step 2" in choice.note
    card = (tmp_path / "out" / "README.md").read_text()
    assert "0.900 at step 3, 0.800 at 6; best 0.900 at step 3 (4 steps)" in card
    assert "Eval reward: no evals were recorded" in card


def test_a_run_without_a_complete_adapter_is_refused_naming_it(experiment: Path, tmp_path):
    run = make_run(experiment, "run_new")
    layout.broadcast_dir(run, 1).mkdir(parents=True)  # being written: no STABLE yet
    with pytest.raises(ExportError, match=r"run_new has no complete adapter") as refused:
        export_adapter(run, tmp_path / "out")
    assert "broadcast/step_1" in str(refused.value) and "Wait for its first" in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_an_existing_output_directory_is_refused_and_left_alone(trained: TrainedRun, tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    (output / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="already exists") as refused:
        export_adapter(trained.run, output)
    assert refused.value.exit_code == 2
    assert [p.name for p in output.iterdir()] == ["notes.txt"]


def test_an_export_that_fails_midway_leaves_nothing(experiment_copy: Path, tmp_path: Path):
    run = experiment_copy / "run_a"
    record_evals(run, {2: 0.9})
    checkpoint = layout.checkpoint_part_dir(run, 2, "trainer")
    (checkpoint / "adapter.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ExportError, match=r"run_a: .*checkpoints/step_2/trainer cannot be read"):
        export_adapter(run, tmp_path / "out" / "adapter")
    assert list((tmp_path / "out").iterdir()) == []


def test_the_command_exports_and_refuses_with_exit_statuses(trained: TrainedRun, tmp_path):
    runner = CliRunner()
    experiment = str(trained.experiment)
    done = runner.invoke(app, ["export", "a", "-e", experiment, "-o", str(tmp_path / "out")])
    assert done.exit_code == 0, done.output
    assert "exported run_a step 5" in done.output and (tmp_path / "out" / "README.md").is_file()
    again = runner.invoke(app, ["export", "run_a", "-e", experiment, "-o", str(tmp_path / "out")])
    assert again.exit_code == 2 and "already exists" in again.output
    unknown = runner.invoke(app, ["export", "nope", "-e", experiment, "-o", str(tmp_path / "x")])
    assert unknown.exit_code == 1 and "no run 'nope'" in unknown.output


def test_the_cards_loading_instructions_keep_an_awkward_path_whole():
    from workbench.export.card import _loading_text

    base = '/models/it\'s a "model" $(touch pwned)'
    adapter = Path("/out/run a; rm -rf ~")
    text = _loading_text(base, adapter, "run_a", rank=8)
    python = card_snippet(text)
    literals = [
        node.value
        for node in ast.walk(ast.parse(python))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    assert literals == [base, base, str(adapter)]
    command = re.search(r"```bash\n(.*?)\n```", text, re.S).group(1)
    assert shlex.split(command) == [
        "python", "-m", "vllm.entrypoints.openai.api_server", "--model", base,
        "--enable-lora", "--lora-modules", f"run_a={adapter}",
    ]  # fmt: skip
