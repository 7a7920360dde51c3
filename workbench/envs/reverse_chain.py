"""`reverse_chain`: reverse several texts in one conversation, one per turn (multi-turn).

The prompt is the first text; after each reply the environment sends the next text as the
user, until `turns` texts have been asked. The episode's reward is the mean similarity of
each reply to its text's reversal (difflib's ratio, as `reverse_text`), so an episode that
gets the first text right and the second half right scores 0.75. Texts are random strings
over `alphabet`, drawn from the prompt's seed: the whole episode is fixed by the prompt.

A model needs to answer in a conversation for the later turns: `builtin:tiny-reverse-chat`
was warmed up with earlier turns in its chats (`reverse_text`'s `max_history`), while
`builtin:tiny-reverse` has only ever seen one turn and answers every later one with nothing.
"""

from __future__ import annotations

import random

from pydantic import Field

from workbench.envs.base import Prompt, Task, random_text, similarity
from workbench.envs.multi_turn import MultiTurnEnvironment
from workbench.envs.reverse_text import TextArgs, parse_reversal


class ReverseChainArgs(TextArgs):
    turns: int = Field(2, ge=1, le=8, description="texts to reverse, one per model turn")
    min_length: int = Field(4, ge=1, description="shortest text, in characters")
    max_length: int = Field(6, ge=1, description="longest text, in characters")


class ReverseChain(MultiTurnEnvironment):
    """Turn k asks for text k reversed; the reward averages the turns' similarities."""

    name = "reverse_chain"
    Args = ReverseChainArgs
    args: ReverseChainArgs

    @property
    def max_turns(self) -> int:
        return self.args.turns

    def make_task(self, rng: random.Random) -> Task:
        args = self.args
        texts = [
            random_text(rng, args.alphabet, args.min_length, args.max_length)
            for _ in range(args.turns)
        ]
        return Task(question=texts[0], answer=texts[0][::-1], info={"texts": texts})

    def task_key(self, task: Task) -> str:
        return "\n".join(task.info["texts"])

    def respond(self, prompt: Prompt, replies: list[str]) -> str | None:
        texts = prompt.info["texts"]
        return texts[len(replies)] if len(replies) < len(texts) else None

    def episode_reward(self, prompt: Prompt, replies: list[str]) -> float:
        texts = prompt.info["texts"]
        scores = [
            similarity(parse_reversal(reply), text[::-1])
            for reply, text in zip(replies, texts, strict=False)
        ]
        return sum(scores) / len(texts)
