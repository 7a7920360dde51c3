"""`Episode`: one prompt's episode as token sequences, what every environment's
episodes are made of and what the trainer trains on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.envs.base import Message, Prompt
from workbench.inference.client import Completion


@dataclass
class Episode:
    """One episode of one prompt: its tokens after the prompt, whose they are, its reward."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """The sampler's log-prob of each token; 0 on the environment's."""
    mask: list[bool] = field(default_factory=list)
    """True on the tokens the model sampled (trained), False on the environment's."""
    replies: list[str] = field(default_factory=list)
    env_messages: list[str] = field(default_factory=list)
    truncated: bool = False
    done: bool = False
    reward: float = 0.0

    @property
    def multi_turn(self) -> bool:
        return not all(self.mask)

    @property
    def model_tokens(self) -> int:
        return sum(self.mask)

    def add_model_turn(self, completion: Completion) -> None:
        # A reply's log-probs can be one short of its ids (a stop token vLLM gave no
        # log-prob); the ids without a log-prob are dropped, as before episodes existed.
        n = min(len(completion.token_ids), len(completion.logprobs))
        self.token_ids += completion.token_ids[:n]
        self.logprobs += completion.logprobs[:n]
        self.mask += [True] * n
        self.replies.append(completion.text)
        self.truncated = self.truncated or completion.truncated
        self.done = self.done or completion.truncated

    def add_env_turn(self, message: str, tokens: list[int]) -> None:
        self.token_ids += tokens
        self.logprobs += [0.0] * len(tokens)
        self.mask += [False] * len(tokens)
        self.env_messages.append(message)

    def chat(self, prompt: Prompt) -> list[Message]:
        """The conversation so far as messages: the prompt's, then each reply and message."""
        messages = list(prompt.messages)
        for turn, reply in enumerate(self.replies):
            messages.append({"role": "assistant", "content": reply})
            if turn < len(self.env_messages):
                messages.append({"role": "user", "content": self.env_messages[turn]})
        return messages

    def transcript(self) -> str:
        """The replies with the environment's messages between them, for the rollout browser."""
        if not self.env_messages:
            return self.replies[0] if self.replies else ""
        parts = []
        for turn, reply in enumerate(self.replies):
            parts.append(reply)
            if turn < len(self.env_messages):
                parts.append(f"[environment] {self.env_messages[turn]}")
        return "\n".join(parts)
