"""A run started from an adapter (`lora.init_from`) samples its first step with that
adapter, which the trainer publishes as `broadcast/step_0`, never with the base model."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import make_run
from tests.orchestrator.scripted import ScriptedChat, make_orchestrator, trainer_publishes_after
from workbench.files import layout
from workbench.files.rollouts import read_rollouts


def test_step_0_waits_for_the_adapter_the_run_starts_from_and_samples_with_it(
    experiment: Path, tmp_path: Path
):
    run = make_run(experiment, "run_a")
    client = ScriptedChat()
    orchestrator = make_orchestrator(run, client, lora={"init_from": str(tmp_path / "sft")})
    polls = []
    orchestrator.sleep = trainer_publishes_after(run, 0, polls, count=2)  # admits the run
    orchestrator.step_once()
    assert len(polls) == 2
    assert client.loaded == ["run_a@step0"]
    assert {request["model"] for request in client.requests} == {"run_a@step0"}
    assert read_rollouts(layout.rollout_dir(run, 0)).policy_version == 0


def test_a_run_from_scratch_still_samples_step_0_with_the_base_model(experiment: Path):
    run = make_run(experiment, "run_a")
    client = ScriptedChat()
    make_orchestrator(run, client).step_once()
    assert client.loaded == [] and {r["model"] for r in client.requests} == {"base"}
