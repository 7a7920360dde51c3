"""Evals of each new policy version, against the scripted stand-in for the inference server.

The stand-in refuses requests for an adapter that is not loaded (as vLLM does), and can
hold or fail the greedy (eval) requests, so the rules about timing, adapter lifetimes and
restarts can be checked exactly. tests/orchestrator/test_eval_with_vllm.py runs an eval
against the real server.
"""

from __future__ import annotations

import logging
import string
import threading
from pathlib import Path

import pytest

from tests.helpers import make_run
from tests.orchestrator.scripted import ScriptedChat, make_orchestrator, publish_adapter
from workbench.envs import EnvironmentConfigError
from workbench.envs.splits import split_of
from workbench.files import layout, run_control
from workbench.files.eval_samples import read_evals
from workbench.files.metrics import read_metrics
from workbench.orchestrator.evaluation import next_due_version
from workbench.orchestrator.loop import Orchestrator

EVERY_2 = {"interval": 2, "num_prompts": 4}


def step_with_version(orchestrator: Orchestrator, run: Path, version: int) -> None:
    """One orchestrator step after the trainer published `version` (0: none yet)."""
    if version:
        publish_adapter(run, version)
    orchestrator.step_once()


def train_to_the_end(orchestrator: Orchestrator, run: Path) -> None:
    for version in range(orchestrator.state.step, orchestrator.config.max_steps):
        step_with_version(orchestrator, run, version)
    publish_adapter(run, orchestrator.config.max_steps)
    orchestrator.run_until_done()


def evaluated(run: Path) -> list[tuple[int, str]]:
    return [(r["policy_version"], r["adapter"]) for r in read_metrics(run, "eval")]


def test_the_next_version_due_is_the_next_multiple_of_the_interval():
    assert next_due_version(None, 10) == 0  # the base model first
    assert next_due_version(0, 10) == 10
    assert next_due_version(10, 10) == 20
    assert next_due_version(13, 10) == 20  # 10 was skipped, 13 scored instead


def test_the_base_model_every_interval_th_version_and_the_last_are_scored_under_their_names(
    experiment: Path,
):
    run = make_run(experiment, "run_a")
    orchestrator = make_orchestrator(run, ScriptedChat(), max_steps=5, eval=EVERY_2)
    train_to_the_end(orchestrator, run)
    assert evaluated(run) == [
        (0, "base"),
        (2, "run_a@step2"),
        (4, "run_a@step4"),
        (5, "run_a@step5"),  # the last version, due whatever the interval
    ]
    for record in read_metrics(run, "eval"):
        assert record["step"] == record["policy_version"]
        assert record["eval_samples"] == 4
        assert 0.0 <= record["eval_reward_mean"] <= 1.0 and record["eval_reward_std"] >= 0.0
        assert record["eval_s"] >= 0.0 and 0.0 <= record["eval_truncated_frac"] <= 1.0
    assert run_control.is_finished(run)


def test_every_eval_asks_the_same_held_out_prompts_with_the_same_seeds_greedily(
    experiment: Path,
):
    run = make_run(experiment, "run_a")
    client = ScriptedChat()
    orchestrator = make_orchestrator(run, client, max_steps=4, eval=EVERY_2)
    train_to_the_end(orchestrator, run)
    greedy = [r for r in client.requests if r["temperature"] == 0]
    sampled = [r for r in client.requests if r["temperature"] != 0]
    evals = [greedy[i : i + 4] for i in range(0, len(greedy), 4)]
    assert len(evals) == 3  # versions 0, 2 and 4
    asked = [sorted((r["question"], r["seed"]) for r in requests) for requests in evals]
    assert asked[0] == asked[1] == asked[2]
    eval_questions = {question for question, _ in asked[0]}
    assert len(eval_questions) == 4 and all(split_of(q) == "eval" for q in eval_questions)
    assert not eval_questions & {r["question"] for r in sampled}


def test_an_eval_runs_beside_training_and_keeps_its_adapter_loaded_until_it_is_done(
    experiment: Path,
):
    run = make_run(experiment, "run_a")
    client = ScriptedChat()
    orchestrator = make_orchestrator(run, client, max_steps=6, eval=EVERY_2)
    step_with_version(orchestrator, run, 0)
    step_with_version(orchestrator, run, 1)
    orchestrator.evaluator.wait()
    client.hold_greedy = threading.Event()  # the next eval hangs until the test lets it go

    step_with_version(orchestrator, run, 2)  # starts the eval of version 2
    step_with_version(orchestrator, run, 3)  # loads version 3 while that eval runs
    assert layout.is_stable(layout.rollout_dir(run, 3)), "training went on"
    assert client.served >= {"run_a@step2", "run_a@step3"}
    assert (2, "run_a@step2") not in evaluated(run)

    client.hold_greedy.set()
    orchestrator.evaluator.wait()
    assert (2, "run_a@step2") in evaluated(run), "its requests found the adapter loaded"
    assert client.served == {"run_a@step3"}, "unloaded once the eval let go of it"
    steps = read_metrics(run, "orchestrator")
    assert all(line["eval_wait_s"] < 1.0 for line in steps)


def test_a_restarted_orchestrator_scores_no_version_twice(experiment: Path):
    run = make_run(experiment, "run_a")
    first = make_orchestrator(run, ScriptedChat(), max_steps=6, eval=EVERY_2)
    for version in (0, 1, 2):
        step_with_version(first, run, version)
    first.evaluator.wait()
    assert [v for v, _ in evaluated(run)] == [0, 2]

    resumed = make_orchestrator(run, ScriptedChat(), max_steps=6, eval=EVERY_2)
    train_to_the_end(resumed, run)  # reloads version 2 first: already scored
    assert [v for v, _ in evaluated(run)] == [0, 2, 4, 6]

    finished = make_orchestrator(run, ScriptedChat(), max_steps=6, eval=EVERY_2)
    finished.run_until_done()  # restarted after the end: the last version is scored already
    assert [v for v, _ in evaluated(run)] == [0, 2, 4, 6]


def test_an_eval_cut_short_by_a_restart_is_done_on_the_adapter_loaded_then(experiment: Path):
    run = make_run(experiment, "run_a")
    cut_short = ScriptedChat()
    first = make_orchestrator(run, cut_short, max_steps=6, eval=EVERY_2)
    step_with_version(first, run, 0)
    first.evaluator.wait()
    step_with_version(first, run, 1)
    cut_short.fail_greedy = True  # stands for the process dying mid-eval: no record
    step_with_version(first, run, 2)
    first.evaluator.wait()

    resumed = make_orchestrator(run, ScriptedChat(), max_steps=6, eval=EVERY_2)
    step_with_version(resumed, run, 3)
    resumed.evaluator.wait()
    assert evaluated(run) == [(0, "base"), (3, "run_a@step3")]


def test_a_failed_eval_costs_its_record_not_the_run(experiment: Path, caplog):
    run = make_run(experiment, "run_a")
    client = ScriptedChat()
    client.fail_greedy = True
    orchestrator = make_orchestrator(run, client, max_steps=3, eval=EVERY_2)
    with caplog.at_level(logging.WARNING):
        train_to_the_end(orchestrator, run)
    assert run_control.is_finished(run) and evaluated(run) == []
    assert "eval of policy version 0 failed" in caplog.text
    assert client.served == {"run_a@step3"}, "held versions were released after the failure"


def test_interval_0_turns_evals_off(experiment: Path):
    run = make_run(experiment, "run_a")
    client = ScriptedChat()
    orchestrator = make_orchestrator(run, client, max_steps=3, eval={"interval": 0})
    train_to_the_end(orchestrator, run)
    assert evaluated(run) == [] and all(r["temperature"] != 0 for r in client.requests)


def test_a_task_space_with_nothing_held_out_fails_at_the_start_unless_evals_are_off(
    experiment: Path,
):
    # A one-letter alphabet and length: a single task, here one the training split keeps.
    letter = next(c for c in string.ascii_lowercase if split_of(c) == "train")
    tiny = {"min_length": 1, "max_length": 1, "alphabet": letter}
    run = make_run(experiment, "run_a")
    with pytest.raises(EnvironmentConfigError, match="no 'eval' prompt"):
        make_orchestrator(run, ScriptedChat(), env_args=tiny, eval=EVERY_2)
    orchestrator = make_orchestrator(run, ScriptedChat(), env_args=tiny, eval={"interval": 0})
    assert orchestrator.dataset[0].question == letter


def test_each_eval_records_every_prompt_with_its_completion_and_reward(experiment: Path):
    """What `workbench samples --compare` reads: per eval and prompt, the prompt, what the
    policy wrote and its reward, and the rewards are those the eval's score averages."""
    run = make_run(experiment, "run_a")
    orchestrator = make_orchestrator(run, ScriptedChat(), max_steps=5, eval=EVERY_2)
    train_to_the_end(orchestrator, run)
    evals = read_evals(run)
    assert [(e.policy_version, e.adapter) for e in evals] == evaluated(run)
    for record, kept in zip(read_metrics(run, "eval"), evals, strict=True):
        assert len(kept.prompts) == 4
        for prompt in kept.prompts:
            (completion,) = prompt.completions  # greedy: one completion a prompt
            assert completion.text == prompt.prompt[::-1][:1]  # the scripted answer
            assert completion.reward == orchestrator.env.reward(
                _prompt_named(orchestrator, prompt.prompt), completion.text
            )
        mean = sum(p.reward for p in kept.prompts) / len(kept.prompts)
        assert mean == pytest.approx(record["eval_reward_mean"])


def _prompt_named(orchestrator: Orchestrator, question: str):
    return next(p for p in orchestrator.evaluator.prompts if p.question == question)
