"""A run started from another run's checkpoint: a run directory made with a copy of
`checkpoints/step_N/` (as prime-rl's multi-run test makes one) resumes at step N with that
adapter, optimizer and schedule, under its own settings and `max_steps`."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.helpers import iterate_published, make_run, random_batch
from workbench.config import ModelSection, TrainerConfig, TrainerSection
from workbench.files import layout
from workbench.files.metrics import read_metrics
from workbench.files.rollouts import write_rollouts
from workbench.trainer.optim.per_run import lr_factor
from workbench.trainer.rl.trainer import build_trainer, load_base_model

# A warm-up longer than the steps trained: a schedule started afresh would show.
SOURCE = "lr = 0.05\ncheckpoint_interval = 1\nmax_steps = 6\n[scheduler]\nwarmup_steps = 4\n"


def make_trainer(experiment: Path, model_dir: Path):
    config = TrainerConfig(
        output_dir=experiment,
        model=ModelSection(base=str(model_dir)),
        trainer=TrainerSection(max_concurrent_runs=2, seq_len=64),
    )
    model = load_base_model(str(model_dir), torch.float32, torch.device("cpu"))
    return build_trainer(config, model, torch.device("cpu"))


def write_batch(run: Path, step: int) -> None:
    """run_a's batch of `step`, under `run`'s id: a copy trains on what its source would."""
    write_rollouts(
        run, dataclasses.replace(random_batch("run_a", step, 10, seed=1), run_id=run.name)
    )


def source_and_copy(experiment: Path, tiny_llama: Path, copy_orch_toml: str):
    """run_a trained two steps; run_copy made with the trainer's part of run_a's step 2
    (the orchestrator's part is the orchestrator's business) and `copy_orch_toml`, with
    the batch of step 2 waiting for both."""
    source = make_run(experiment, "run_a", SOURCE)
    for step in range(2):
        write_batch(source, step)
    trainer = make_trainer(experiment, tiny_llama)
    assert [iterate_published(trainer) for _ in range(3)] == ["trained", "trained", "idle"]
    copy = experiment / "run_copy"
    shutil.copytree(
        layout.checkpoint_part_dir(source, 2, "trainer"),
        layout.checkpoint_part_dir(copy, 2, "trainer"),
    )
    make_run(experiment, "run_copy", copy_orch_toml)
    write_batch(source, 2)
    write_batch(copy, 2)
    return trainer, copy


def test_a_run_made_from_a_copied_checkpoint_trains_on_as_its_source_would(tmp_path, tiny_llama):
    # A longer max_steps, as prime-rl's test gives a finished run's copy.
    trainer, copy = source_and_copy(
        tmp_path, tiny_llama, SOURCE.replace("max_steps = 6", "max_steps = 8")
    )
    assert iterate_published(trainer) == "trained"  # discovers the copy, resumes it, trains both
    manager = trainer.manager
    a, c = manager.id_2_idx["run_a"], manager.id_2_idx["run_copy"]
    assert manager.progress[c].step == manager.progress[a].step == 3
    # Its adapter of step 2 was published at once: its orchestrator samples with it.
    assert layout.is_stable(layout.broadcast_dir(copy, 2))
    for (name, trained), (_, source_trained) in zip(
        manager.get_named_parameters_for_run(c),
        manager.get_named_parameters_for_run(a),
        strict=True,
    ):
        torch.testing.assert_close(trained, source_trained, rtol=1e-6, atol=1e-7, msg=name)
    source_moments = trainer.optimizer.state_dict_for_run(a)["state"]
    for key, state in trainer.optimizer.state_dict_for_run(c)["state"].items():
        assert state["step"] == source_moments[key]["step"] == 3
        torch.testing.assert_close(state["exp_avg_sq"], source_moments[key]["exp_avg_sq"])
    # The warm-up went on from update 3 (its lr after it: 0.05 * 4 / 4).
    (line,) = [r for r in read_metrics(copy) if r["source"] == "trainer"]
    assert line["step"] == 3
    assert line["lr"] == 0.05


def test_a_copied_checkpoint_trains_with_the_new_runs_learning_rate(tmp_path, tiny_llama):
    trainer, copy = source_and_copy(tmp_path, tiny_llama, SOURCE.replace("lr = 0.05", "lr = 0.01"))
    assert iterate_published(trainer) == "trained"
    c = trainer.manager.id_2_idx["run_copy"]
    schedule = trainer.manager.config[c].scheduler
    # The schedule goes on from the source's update count, on the copy's own lr.
    assert trainer.optimizer.get_lr(c) == 0.01 * lr_factor(schedule, 3, 6)
    assert trainer.scheduler.schedulers[c].base_lrs == [0.01]
    kept = load_file(str(layout.checkpoint_part_dir(copy, 3, "trainer") / "adapter.safetensors"))
    started = load_file(str(layout.checkpoint_part_dir(copy, 2, "trainer") / "adapter.safetensors"))
    assert any(not torch.equal(kept[key], started[key]) for key in kept)
