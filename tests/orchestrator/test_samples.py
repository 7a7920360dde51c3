"""The rollout browser's record: each step's prompts and completions as text, kept small."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import make_run
from tests.orchestrator.scripted import ScriptedChat, make_orchestrator
from workbench.files import layout
from workbench.files.rollouts import read_rollouts
from workbench.files.samples import (
    KEEP_STEPS,
    describe_step,
    find_step,
    read_steps,
    record_step,
    reward_histogram,
)


def test_a_step_records_each_group_with_text_reward_and_the_advantage_the_trainer_gets(
    experiment: Path,
):
    run = make_run(experiment, "run_a")
    orchestrator = make_orchestrator(run, ScriptedChat())
    prompts = orchestrator.dataset.take(0, 2)
    orchestrator.step_once()

    (recorded,) = read_steps(run)
    assert recorded.step == 0 and recorded.policy_version == 0 and recorded.written
    assert len(recorded.groups) == 2 and all(len(g.completions) == 4 for g in recorded.groups)
    for prompt, group in zip(prompts, recorded.groups, strict=True):
        assert (group.prompt, group.answer) == (prompt.question, prompt.answer)
        # ScriptedChat answers completion i with the first i + 1 letters of the reversal.
        texts = [prompt.question[::-1][: i + 1] for i in range(4)]
        assert [c.text for c in group.completions] == texts
        assert group.rewards == [orchestrator.env.reward(prompt, text) for text in texts]
        assert group.reward_spread > 0
    trained = read_rollouts(layout.rollout_dir(run, 0), vocab_size=64, max_sample_tokens=64)
    flat = [c for g in recorded.groups for c in g.completions]
    # The rollouts store float32.
    assert [c.advantage for c in flat] == pytest.approx([s.advantage for s in trained.samples()])
    assert [c.tokens for c in flat] == [len(s.completion_ids) for s in trained.samples()]
    assert all(not c.truncated for c in flat)


def test_only_the_newest_steps_are_kept(experiment: Path):
    run = make_run(experiment, "run_a")
    steps = KEEP_STEPS + 3
    orchestrator = make_orchestrator(run, ScriptedChat(), max_steps=steps, async_level=steps)
    for _ in range(steps):
        orchestrator.step_once()

    recorded = read_steps(run)
    assert [s.step for s in recorded] == list(range(3, steps))
    assert find_step(recorded).step == steps - 1
    assert find_step(recorded, 2) is None


def test_a_dropped_batch_is_recorded_and_the_retry_is_the_step_shown(experiment: Path):
    run = make_run(experiment, "run_a")
    calls = {"n": 0}

    def varied_after_the_first_batch(text, i):
        calls["n"] += 1
        return "zzz" if calls["n"] <= 8 else text[::-1][: i + 1]

    orchestrator = make_orchestrator(run, ScriptedChat(answer=varied_after_the_first_batch))
    orchestrator.step_once()
    orchestrator.step_once()

    dropped, retry = read_steps(run)
    assert (dropped.step, dropped.written) == (0, False)
    assert all(g.reward_spread == 0 for g in dropped.groups)
    assert find_step([dropped, retry], 0) is retry and retry.written


def test_a_torn_line_is_skipped_and_the_next_step_still_records(experiment: Path):
    run = make_run(experiment, "run_a")
    orchestrator = make_orchestrator(run, ScriptedChat(), async_level=3)
    orchestrator.step_once()
    with layout.samples_path(run).open("a") as handle:
        handle.write('{"step": 1, "groups": [')
    assert [s.step for s in read_steps(run)] == [0]
    record_step(run, read_steps(run)[0])
    assert [s.step for s in read_steps(run)] == [0, 0]


def test_histogram_bins_cover_the_rewards_seen():
    bins = reward_histogram([0.0, 0.1, 0.5, 1.0, 1.0], bins=4)
    assert [count for _, _, count in bins] == [2, 0, 1, 2]
    assert bins[0][0] == 0.0 and bins[-1][1] == 1.0
    assert reward_histogram([0.7, 0.7]) == [(0.7, 0.7, 2)]
    assert reward_histogram([]) == []


def test_a_step_described_as_text_has_every_group_best_completion_first(experiment: Path):
    run = make_run(experiment, "run_a")
    make_orchestrator(run, ScriptedChat()).step_once()
    (recorded,) = read_steps(run)

    lines = describe_step(recorded)
    assert lines[0].startswith("step 0  policy version 0  trained")
    assert sum(line.startswith("group ") for line in lines) == 2
    group_start = next(i for i, line in enumerate(lines) if line.startswith("group 1"))
    rewards = [float(line.split()[0]) for line in lines[group_start + 1 : group_start + 5]]
    assert rewards == sorted(rewards, reverse=True)
    histogram = lines[2:group_start]
    assert sum(int(line.split()[-1]) for line in histogram) == 8


def test_samples_command_prints_a_recorded_step_as_text_or_json(experiment: Path):
    from typer.testing import CliRunner

    from workbench.cli import app

    run = make_run(experiment, "run_a")
    orchestrator = make_orchestrator(run, ScriptedChat(), async_level=3)
    orchestrator.step_once()
    orchestrator.step_once()
    runner = CliRunner()

    newest = runner.invoke(app, ["samples", "a", "-e", str(experiment)])
    assert newest.exit_code == 0 and newest.output.startswith("step 1  policy version 0")
    first = runner.invoke(app, ["samples", "run_a", "--step", "0", "--json", "-e", str(experiment)])
    record = json.loads(first.output)
    assert record["step"] == 0 and len(record["groups"]) == 2
    assert record["groups"][0]["completions"][0]["text"]

    missing = runner.invoke(app, ["samples", "run_a", "--step", "7", "-e", str(experiment)])
    assert missing.exit_code == 1 and "steps kept: 0, 1" in missing.output
