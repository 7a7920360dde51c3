"""Multi-turn environments: an episode of several model turns with the environment's
messages between them, scored as a whole.

The first turn is the prompt, as in any environment. After each model reply the environment
answers (`respond`: a user or tool message) or ends the episode (None); at most `max_turns`
replies are asked for. The episode's reward (`episode_reward`) sees every reply, and the
advantages are computed per episode, over the group of episodes of one prompt. How the
episode's tokens are kept exact (the model's own tokens trained, the environment's masked)
is the orchestrator's business: `workbench.orchestrator.episodes`.

A multi-turn environment is still an `Environment`: its prompt stream, held-out split and
system prompt work the same, and `reward(prompt, completion)` scores a one-reply episode.
"""

from __future__ import annotations

from abc import abstractmethod

from workbench.envs.base import Environment, Prompt


class MultiTurnEnvironment(Environment):
    """An `Environment` whose episodes run several turns; implement `respond`,
    `episode_reward` and `max_turns`, and the single-turn `parse_answer`/`score` if a one-reply
    score means something else than the episode's."""

    @property
    @abstractmethod
    def max_turns(self) -> int:
        """The most model replies an episode has."""

    @abstractmethod
    def respond(self, prompt: Prompt, replies: list[str]) -> str | None:
        """The environment's message after the model's `replies` so far (as the user), or
        None when the episode is over. Called after every reply, the last one excepted when
        the episode has reached `max_turns`."""

    @abstractmethod
    def episode_reward(self, prompt: Prompt, replies: list[str]) -> float:
        """How good the whole episode was, in [0, 1]."""

    def reward(self, prompt: Prompt, completion: str) -> float:
        return self.clamped_episode_reward(prompt, [completion])

    def clamped_episode_reward(self, prompt: Prompt, replies: list[str]) -> float:
        return min(1.0, max(0.0, float(self.episode_reward(prompt, replies))))

    def parse_answer(self, completion: str) -> str | None:
        return completion

    def score(self, parsed_answer: str | None, prompt: Prompt) -> float:
        return self.clamped_episode_reward(prompt, [parsed_answer or ""])
