"""`letter_count`: how many times does a letter occur in a word? In digits or in letters.

A second, deliberately different environment from `reverse_text`. It answers in one of two
ways (`env_args.answer`):

- `"digits"` (the default): a system prompt asks for the number, the answer is the first
  integer parsed out of free text and the reward is all or nothing. A model must write digits;
  the built-in tiny model never does, so its runs stop with "no learning signal".
- `"letters"`: the answer is the letter written as many times as it occurs ("aaa" for `a` in
  "banana"), scored like `reverse_text` by `difflib` similarity, so a nearly right answer earns
  partial credit and RL has a graded signal. The user message is the word, a space and the
  letter ("banana a"), with no system prompt, since the built-in tiny model is trained
  without one (a system prompt makes it write almost nothing); a hub model needs an
  instruction: give it with `env_args = { system_prompt = "..." }`. The letter asked about is
  always one of the word's, since "none" would be an empty answer. This is the way the
  built-in tiny model learns the task: it starts by reversing the message ("ababa" for
  "aba a") and RL teaches it to keep only the letter asked about.
"""

from __future__ import annotations

import random
import re
import string
from typing import Literal

from pydantic import Field, model_validator

from workbench.envs.base import (
    EnvArgs,
    Environment,
    Prompt,
    Task,
    random_text,
    similarity,
    strip_reasoning,
)

_INTEGER = re.compile(r"-?\d+")

DIGITS_SYSTEM_PROMPT = (
    "count how many times the letter occurs in the word. answer with the number only."
)


class LetterCountArgs(EnvArgs):
    min_length: int = Field(3, ge=1, description="shortest word, in letters")
    max_length: int = Field(10, ge=1, description="longest word, in letters")
    alphabet: str = Field(
        string.ascii_lowercase,
        min_length=1,
        description="the letters words are made of, and asked about",
    )
    answer: Literal["digits", "letters"] = Field(
        "digits",
        description='"digits": the count as a number, exact-match reward; "letters": the '
        'letter written as many times as it occurs ("aaa" for a in banana), similarity '
        "reward, no system prompt (what the built-in tiny model learns)",
    )

    @model_validator(mode="after")
    def _lengths_ordered(self) -> LetterCountArgs:
        if self.min_length > self.max_length:
            raise ValueError(
                f"min_length ({self.min_length}) must not exceed max_length ({self.max_length})"
            )
        if self.answer == "letters" and not self.alphabet.strip():
            raise ValueError('answer = "letters" needs an alphabet with a non-space letter')
        return self


class LetterCount(Environment):
    name = "letter_count"
    Args = LetterCountArgs
    args: LetterCountArgs
    default_system_prompt = DIGITS_SYSTEM_PROMPT

    @property
    def system_prompt(self) -> str | None:
        # Letters are for the built-in tiny model, which writes almost nothing after a system
        # prompt; an explicit `system_prompt` still wins.
        if self.args.system_prompt is None and self.args.answer == "letters":
            return None
        return super().system_prompt

    def make_task(self, rng: random.Random) -> Task:
        if self.args.answer == "letters":
            return self._letters_task(rng)
        word = random_text(rng, self.args.alphabet, self.args.min_length, self.args.max_length)
        # Half the time ask for a letter of the word, so answers are not almost always 0.
        letter = rng.choice(word) if rng.random() < 0.5 else rng.choice(self.args.alphabet)
        count = word.count(letter)
        return Task(
            question=f"letter: {letter}\nword: {word}",
            answer=str(count),
            info={"letter": letter, "word": word, "count": count},
        )

    def _letters_task(self, rng: random.Random) -> Task:
        word = random_text(rng, self.args.alphabet, self.args.min_length, self.args.max_length)
        # A letter of the word (never a space), so the answer is never empty.
        letter = rng.choice([c for c in word if not c.isspace()])
        count = word.count(letter)
        return Task(
            question=f"{word} {letter}",
            answer=letter * count,
            info={"letter": letter, "word": word, "count": count},
        )

    def parse_answer(self, completion: str) -> str | None:
        """Digits: the first integer in the completion; letters: the whole completion,
        stripped (after any reasoning block in both)."""
        text = strip_reasoning(completion)
        if self.args.answer == "letters":
            return text.strip() or None
        match = _INTEGER.search(text)
        return match.group(0) if match else None

    def score(self, parsed_answer: str | None, prompt: Prompt) -> float:
        if parsed_answer is None:
            return 0.0
        if self.args.answer == "letters":
            return similarity(parsed_answer, prompt.answer)
        return 1.0 if int(parsed_answer) == int(prompt.info["count"]) else 0.0
