"""The orchestrator's logic without a server: a scripted stand-in answers chat requests.

The real vLLM server is exercised in tests/inference; here the stand-in lets each rule
(advantages, async gating, eviction, empty batches, resume) be checked exactly.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import make_run
from tests.orchestrator.scripted import (
    ScriptedChat,
    make_orchestrator,
    publish_adapter,
    trainer_publishes_after,
)
from workbench.files import layout, run_control
from workbench.files.metrics import read_metrics
from workbench.files.rollouts import read_rollouts
from workbench.orchestrator.advantages import (
    group_advantages,
    has_learning_signal,
    steps_ahead_allowed,
)
from workbench.orchestrator.loop import RunEvicted
from workbench.orchestrator.state import load_state


def test_advantages_are_reward_minus_group_mean():
    assert group_advantages([1.0, 0.0, 0.5, 0.5], 2) == [0.5, -0.5, 0.0, 0.0]
    assert has_learning_signal([0.5, -0.5, 0.0, 0.0])
    assert not has_learning_signal(group_advantages([0.3, 0.3, 1.0, 1.0], 2))
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages([1.0, 2.0], 3)


def test_async_level_bounds_how_far_ahead_of_the_adapter_a_step_may_be():
    assert steps_ahead_allowed(step=0, loaded_version=0, async_level=0)
    assert not steps_ahead_allowed(step=1, loaded_version=0, async_level=0)
    assert steps_ahead_allowed(step=1, loaded_version=0, async_level=1)
    assert not steps_ahead_allowed(step=2, loaded_version=0, async_level=1)
    assert steps_ahead_allowed(step=5, loaded_version=3, async_level=2)


def test_a_step_writes_a_batch_the_trainer_reads_and_a_metrics_line(experiment: Path):
    run = make_run(experiment, "run_a")
    orchestrator = make_orchestrator(run, ScriptedChat())
    result = orchestrator.step_once()
    assert result.written and result.step == 0
    batch = read_rollouts(layout.rollout_dir(run, 0), vocab_size=64, max_sample_tokens=64)
    assert batch.num_samples == 8 and batch.policy_version == 0
    samples = batch.samples()
    assert all(s.prompt_ids == [1, 5, 6, 7] for s in samples)
    # advantages are per group of 4 and sum to zero in each group
    assert abs(sum(s.advantage for s in samples[:4])) < 1e-6
    metrics = read_metrics(run, "orchestrator")
    assert metrics[-1]["step"] == 0 and 0.0 <= metrics[-1]["reward_mean"] <= 1.0
    assert {"reward_std", "completion_len_mean", "truncated_frac", "generation_s", "wait_s"} <= set(
        metrics[-1]
    )


def test_orchestrator_waits_for_the_adapter_when_async_level_is_reached(experiment: Path):
    run = make_run(experiment, "run_a")
    client = ScriptedChat()
    orchestrator = make_orchestrator(run, client, async_level=1)
    orchestrator.step_once()
    orchestrator.step_once()  # step 1 may use version 0
    polls = []
    orchestrator.sleep = trainer_publishes_after(run, 1, polls, count=3)
    orchestrator.step_once()  # step 2 needs version >= 1
    assert len(polls) == 3
    assert client.loaded == ["run_a@step1"]
    assert client.requests[-1]["model"] == "run_a@step1"
    assert read_rollouts(layout.rollout_dir(run, 2)).policy_version == 1


def test_new_adapter_versions_get_fresh_names_and_the_old_one_is_unloaded(experiment: Path):
    run = make_run(experiment, "run_a")
    client = ScriptedChat()
    orchestrator = make_orchestrator(run, client, max_steps=5)
    publish_adapter(run, 1)
    orchestrator.step_once()
    publish_adapter(run, 2)
    orchestrator.step_once()
    assert client.loaded == ["run_a@step1", "run_a@step2"]
    assert client.unloaded == ["run_a@step1"]


def test_evicted_run_stops_at_the_start_of_the_next_iteration_with_the_reason(experiment: Path):
    run = make_run(experiment, "run_a")
    orchestrator = make_orchestrator(run, ScriptedChat())
    orchestrator.step_once()
    run_control.write_eviction(run, "evicted from the TUI: wrong lr", by="tui")
    with pytest.raises(RunEvicted, match="wrong lr"):
        orchestrator.step_once()
    assert not layout.rollout_dir(run, 1).exists()


def test_three_batches_without_learning_signal_evict_the_run(experiment: Path):
    run = make_run(experiment, "run_a")
    same_answer = ScriptedChat(answer=lambda text, i: "zzz")
    orchestrator = make_orchestrator(run, same_answer)
    assert not orchestrator.step_once().written
    assert not orchestrator.step_once().written
    with pytest.raises(RunEvicted, match="no learning signal"):
        orchestrator.step_once()
    eviction = run_control.read_eviction(run)
    assert eviction.evicted_by == "orchestrator" and "3 consecutive" in eviction.reason
    assert not layout.rollout_dir(run, 0).exists()


def test_a_batch_with_signal_resets_the_empty_streak(experiment: Path):
    run = make_run(experiment, "run_a")
    calls = {"n": 0}

    def sometimes_varied(text, i):
        calls["n"] += 1
        return "zzz" if calls["n"] <= 16 else text[::-1][: i + 1]

    orchestrator = make_orchestrator(run, ScriptedChat(answer=sometimes_varied))
    assert not orchestrator.step_once().written
    assert not orchestrator.step_once().written
    assert orchestrator.step_once().written
    assert orchestrator.state.empty_batches == 0


def test_restarted_orchestrator_resumes_step_data_position_and_rng(experiment: Path):
    run = make_run(experiment, "run_a")
    first = make_orchestrator(run, ScriptedChat(), max_steps=5)
    publish_adapter(run, 1)
    first.step_once()
    first.step_once()
    continued_seed = first.rng.randrange(2**31)

    resumed = make_orchestrator(run, ScriptedChat(), max_steps=5)
    assert resumed.state.step == 2
    assert resumed.state.data_position == 4  # 2 prompts per step
    assert resumed.rng.randrange(2**31) == continued_seed
    assert load_state(run).step == 2


def test_finished_run_waits_for_the_trainers_last_adapter_then_marks_finished(experiment: Path):
    run = make_run(experiment, "run_a")
    orchestrator = make_orchestrator(run, ScriptedChat(), max_steps=2, async_level=2)
    waits = []

    def trainer(seconds):
        waits.append(seconds)
        publish_adapter(run, 2)

    orchestrator.sleep = trainer
    orchestrator.run_until_done()
    assert run_control.is_finished(run) and len(waits) == 1


def test_an_orchestrator_process_does_not_load_torch():
    """Every run has its own orchestrator, and torch would add ~190 MB of memory and ~1.6
    CPU-seconds to start each one (the import measured on the 2-core machine). It writes
    rollouts with numpy; only the trainer reads them with torch."""
    probe = (
        "import sys, workbench.orchestrator.__main__, workbench.orchestrator.loop; "
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
