"""`letter_count`: how many times does a letter occur in a word? Exact-match reward.

A second, deliberately different environment: it has a system prompt, its answer is a number
parsed out of free text, and its reward is all or nothing. It proves the interface is not
shaped around `reverse_text`.
"""

from __future__ import annotations

import random
import re
import string

from pydantic import Field, model_validator

from workbench.envs.base import EnvArgs, Environment, Prompt, Task, random_text, strip_reasoning

_INTEGER = re.compile(r"-?\d+")


class LetterCountArgs(EnvArgs):
    min_length: int = Field(3, ge=1, description="shortest word, in letters")
    max_length: int = Field(10, ge=1, description="longest word, in letters")
    alphabet: str = Field(
        string.ascii_lowercase,
        min_length=1,
        description="the letters words are made of, and asked about",
    )

    @model_validator(mode="after")
    def _lengths_ordered(self) -> LetterCountArgs:
        if self.min_length > self.max_length:
            raise ValueError(
                f"min_length ({self.min_length}) must not exceed max_length ({self.max_length})"
            )
        return self


class LetterCount(Environment):
    name = "letter_count"
    Args = LetterCountArgs
    args: LetterCountArgs
    default_system_prompt = (
        "count how many times the letter occurs in the word. answer with the number only."
    )

    def make_task(self, rng: random.Random) -> Task:
        word = random_text(rng, self.args.alphabet, self.args.min_length, self.args.max_length)
        # Half the time ask for a letter of the word, so answers are not almost always 0.
        letter = rng.choice(word) if rng.random() < 0.5 else rng.choice(self.args.alphabet)
        count = word.count(letter)
        return Task(
            question=f"letter: {letter}\nword: {word}",
            answer=str(count),
            info={"letter": letter, "word": word, "count": count},
        )

    def parse_answer(self, completion: str) -> str | None:
        """The first integer in the completion (after any reasoning block)."""
        match = _INTEGER.search(strip_reasoning(completion))
        return match.group(0) if match else None

    def score(self, parsed_answer: str | None, prompt: Prompt) -> float:
        if parsed_answer is None:
            return 0.0
        return 1.0 if int(parsed_answer) == int(prompt.info["count"]) else 0.0
