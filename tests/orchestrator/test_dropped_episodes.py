"""An environment that runs its own episodes (a verifiers harness) may lose some: a failed
episode is left out of its group and counted in the step's metrics, and a harness whose
every episode fails stops the run with its reason.

`FlakyHarness` stands in for such an environment (the real one needs the verifiers venv and
a server; tests/envs/test_verifiers_env.py runs it): the built-in reverse_text prompts, its
episodes made up, with the episodes it is told to lose left out as the verifiers
environment leaves them out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import make_run
from tests.orchestrator.scripted import ScriptedChat
from workbench.config import OrchestratorConfig
from workbench.envs.episode import Episode
from workbench.envs.external import ExternalEpisodeError, ExternalEpisodes
from workbench.envs.reverse_text import ReverseText
from workbench.files import layout, run_control
from workbench.files.metrics import read_metrics
from workbench.files.rollouts import read_rollouts
from workbench.inference.client import AdapterVersions
from workbench.orchestrator.loop import Orchestrator, RunEvicted


class FlakyHarness(ExternalEpisodes, ReverseText):
    """Episode `j` of prompt `i` scores `j / n`; `lost` (prompt, episode) pairs are left
    out; `broken`: every episode fails."""

    def __init__(self, lost: set[tuple[int, int]] = frozenset(), broken: bool = False):
        super().__init__()
        self.lost, self.broken = set(lost), broken

    def run_episodes(self, endpoint, prompts, seeds, *, model, n, sampling):
        if self.broken:
            raise ExternalEpisodeError("harness 'null' exited 1: ModuleNotFoundError: openai")
        return [
            [
                Episode(
                    prompt_ids=[1, 2],
                    token_ids=[3, 4, 5],
                    logprobs=[-0.5] * 3,
                    mask=[True] * 3,
                    replies=["abc"],
                    done=True,
                    reward=j / n,
                )
                for j in range(n)
                if (i, j) not in self.lost
            ]
            for i, _ in enumerate(prompts)
        ]


def orchestrator(run: Path, env: FlakyHarness) -> Orchestrator:
    config = OrchestratorConfig(
        batch_size=12, rollouts_per_prompt=4, max_steps=3, eval={"interval": 0}
    )
    client = ScriptedChat()
    return Orchestrator(run, config, client, AdapterVersions(client, run.name), poll_s=0.0, env=env)


def test_a_failed_episode_leaves_its_group_and_is_counted(experiment: Path):
    run = make_run(experiment, "run_a")
    # Prompt 0 loses one episode, prompt 1 all but one (a group of one has no baseline).
    env = FlakyHarness(lost={(0, 0), (1, 1), (1, 2), (1, 3)})
    result = orchestrator(run, env).step_once()

    assert result.written
    (record,) = read_metrics(run, "orchestrator")
    assert record["dropped_episodes"] == 5, "four failed, and the one left alone"
    samples = read_rollouts(layout.rollout_dir(run, 0)).samples()
    assert len(samples) == 3 + 4, "prompt 0's three episodes and prompt 2's four"
    rewards = [s.reward for s in samples]
    assert rewards == [0.25, 0.5, 0.75, 0.0, 0.25, 0.5, 0.75]
    # Each group's advantages are against its own episodes' mean.
    assert [s.advantage for s in samples[:3]] == pytest.approx([-0.25, 0.0, 0.25])
    assert [s.advantage for s in samples[3:]] == pytest.approx([-0.375, -0.125, 0.125, 0.375])


def test_a_step_without_losses_counts_none(experiment: Path):
    run = make_run(experiment, "run_a")
    orchestrator(run, FlakyHarness()).step_once()
    (record,) = read_metrics(run, "orchestrator")
    assert record["dropped_episodes"] == 0


def test_a_harness_whose_every_episode_fails_stops_the_run_with_its_reason(experiment: Path):
    run = make_run(experiment, "run_a")
    with pytest.raises(RunEvicted, match="ModuleNotFoundError: openai"):
        orchestrator(run, FlakyHarness(broken=True)).step_once()
    eviction = run_control.read_eviction(run)
    assert eviction is not None and "every episode of a step failed" in eviction.reason


def test_a_step_whose_every_group_is_left_with_one_episode_stops_the_run(experiment: Path):
    run = make_run(experiment, "run_a")
    lost = {(i, j) for i in range(3) for j in range(1, 4)}
    with pytest.raises(RunEvicted, match="no prompt of step 0 kept two episodes"):
        orchestrator(run, FlakyHarness(lost=lost)).step_once()
