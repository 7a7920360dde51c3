"""A fork samples its first steps with the adapter it was forked from, never with the base
model: the trainer publishes the copied checkpoint as `broadcast/step_N` when it admits the
fork, and until then the fork's step N waits, whatever `async_level` would allow (a run from
scratch may sample step N <= async_level before any update, with the base model)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import make_run
from tests.orchestrator.scripted import (
    ScriptedChat,
    make_orchestrator,
    publish_adapter,
    trainer_publishes_after,
)
from workbench.files import layout
from workbench.files.metrics import read_metrics
from workbench.files.rollouts import read_rollouts
from workbench.supervisor.fork import fork_run


def source_with_checkpoint_at_step_1(experiment: Path) -> Path:
    """run_a after one step, with both parts of its checkpoint of step 1 (the trainer's as
    the orchestrator sees it: STABLE)."""
    source = make_run(experiment, "run_a")
    orchestrator = make_orchestrator(source, ScriptedChat())
    publish_adapter(source, 0)
    orchestrator.step_once()
    with layout.staged_directory(layout.checkpoint_part_dir(source, 1, "trainer")) as staging:
        (staging / "progress.json").write_text("{}")
    return source


def test_a_forks_first_step_waits_for_its_adapter_and_samples_with_it(experiment: Path):
    source_with_checkpoint_at_step_1(experiment)
    fork = fork_run(experiment, "run_a@1", "run_f", {})
    client = ScriptedChat()
    # Step 1 is within async_level (1) of version 0: a run from scratch would go ahead.
    orchestrator = make_orchestrator(fork.path, client, async_level=1)
    assert orchestrator.state.step == 1
    polls: list[float] = []
    orchestrator.sleep = trainer_publishes_after(fork.path, 1, polls, count=3)

    orchestrator.step_once()

    assert len(polls) == 3  # it waited until the trainer published the fork's step 1
    assert {request["model"] for request in client.requests} == {"run_f@step1"}
    assert read_rollouts(layout.rollout_dir(fork.path, 1)).policy_version == 1


def test_a_forks_first_eval_scores_its_adapter_not_the_base_model(experiment: Path):
    source_with_checkpoint_at_step_1(experiment)
    fork = fork_run(experiment, "run_a@1", "run_f", {})
    client = ScriptedChat()
    orchestrator = make_orchestrator(fork.path, client, eval={"interval": 1, "num_prompts": 2})
    orchestrator.sleep = trainer_publishes_after(fork.path, 1, [], count=1)

    orchestrator.step_once()
    orchestrator.evaluator.wait()

    evals = read_metrics(fork.path, "eval")
    assert [record["policy_version"] for record in evals] == [1]
    assert "base" not in {request["model"] for request in client.requests}
