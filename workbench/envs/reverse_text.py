"""`reverse_text`: reverse a short text character by character.

The reward is the `difflib.SequenceMatcher` ratio of the parsed answer to the exact reversal,
so a nearly right answer earns nearly full credit and RL has a graded signal. Texts are random
strings over `alphabet` (lowercase letters by default), generated locally from the seed:
nothing is downloaded and the stream never runs out.

The default lengths (8 to 14 letters) are longer than the 3 to 8 letters the built-in tiny
model is warmed up on: it starts RL with a greedy reward of about 0.48 there (0.98 on its
warm-up lengths, 0.64 on 6 to 12 letters; see `workbench.models.tiny_reverse`), clearly above
0 and with room to climb.
"""

from __future__ import annotations

import random
import string

from pydantic import Field, model_validator

from workbench.envs.base import (
    EnvArgs,
    Environment,
    Prompt,
    Task,
    extract_tagged,
    random_text,
    similarity,
    strip_reasoning,
)

ANSWER_TAG = "reversed_text"


class ReverseTextArgs(EnvArgs):
    min_length: int = Field(8, ge=1, description="shortest text, in characters")
    max_length: int = Field(14, ge=1, description="longest text, in characters")
    alphabet: str = Field(
        string.ascii_lowercase, min_length=1, description="the characters texts are made of"
    )

    @model_validator(mode="after")
    def _lengths_ordered(self) -> ReverseTextArgs:
        if self.min_length > self.max_length:
            raise ValueError(
                f"min_length ({self.min_length}) must not exceed max_length ({self.max_length})"
            )
        if self.alphabet.isspace():
            raise ValueError("alphabet must contain at least one non-whitespace character")
        return self


class ReverseText(Environment):
    """The user message is the text itself; the answer is that text reversed.

    No system prompt by default: the built-in tiny model is trained without one. A hub model
    needs an instruction; give it with `env_args = { system_prompt = "..." }`. Such a model may
    wrap its answer in `<reversed_text>` tags or think first: the parser accepts both.
    """

    name = "reverse_text"
    Args = ReverseTextArgs
    args: ReverseTextArgs

    def make_task(self, rng: random.Random) -> Task:
        text = random_text(rng, self.args.alphabet, self.args.min_length, self.args.max_length)
        return Task(question=text, answer=text[::-1])

    def parse_answer(self, completion: str) -> str | None:
        text = strip_reasoning(completion)
        tagged = extract_tagged(text, ANSWER_TAG)
        answer = (tagged if tagged is not None else text).strip()
        return answer or None

    def score(self, parsed_answer: str | None, prompt: Prompt) -> float:
        return similarity(parsed_answer, prompt.answer)
