"""`reverse_text`: reverse a short text character by character.

The reward is the `difflib.SequenceMatcher` ratio of the parsed answer to the exact reversal,
so a nearly right answer earns nearly full credit and RL has a graded signal. Texts are random
strings over `alphabet` (lowercase letters by default), generated locally from the seed:
nothing is downloaded and the stream never runs out.

The default lengths (8 to 14 letters) are longer than the 3 to 8 letters the built-in tiny
model is warmed up on: it starts RL with a greedy reward of about 0.48 there (0.98 on its
warm-up lengths, 0.64 on 6 to 12 letters; see `workbench.trainer.sft.tiny_reverse`), clearly above
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


class TextArgs(EnvArgs):
    """The random texts a reversal task asks about (`reverse_text`, `reverse_chain`)."""

    min_length: int = Field(8, ge=1, description="shortest text, in characters")
    max_length: int = Field(14, ge=1, description="longest text, in characters")
    alphabet: str = Field(
        string.ascii_lowercase, min_length=1, description="the characters texts are made of"
    )

    @model_validator(mode="after")
    def _lengths_ordered(self) -> TextArgs:
        if self.min_length > self.max_length:
            raise ValueError(
                f"min_length ({self.min_length}) must not exceed max_length ({self.max_length})"
            )
        if self.alphabet.isspace():
            raise ValueError("alphabet must contain at least one non-whitespace character")
        return self


class ReverseTextArgs(TextArgs):
    max_history: int = Field(
        0,
        ge=0,
        le=8,
        description="up to this many earlier texts, already reversed, come before the one "
        "to reverse in the chat (0 to max_history, evenly): teaches a model to answer in a "
        "conversation, as `reverse_chain`'s later turns ask",
    )


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
        text = self._text(rng)
        if not self.args.max_history:
            return Task(question=text, answer=text[::-1])
        chat = []
        for _ in range(rng.randint(0, self.args.max_history)):
            earlier = self._text(rng)
            chat += [
                {"role": "user", "content": earlier},
                {"role": "assistant", "content": earlier[::-1]},
            ]
        chat.append({"role": "user", "content": text})
        return Task(question=text, answer=text[::-1], chat=chat if len(chat) > 1 else None)

    def _text(self, rng: random.Random) -> str:
        return random_text(rng, self.args.alphabet, self.args.min_length, self.args.max_length)

    def parse_answer(self, completion: str) -> str | None:
        return parse_reversal(completion)

    def score(self, parsed_answer: str | None, prompt: Prompt) -> float:
        return similarity(parsed_answer, prompt.answer)


def parse_reversal(completion: str) -> str | None:
    """The reversed text in a completion: inside `<reversed_text>` tags if there are any,
    else all of it, `<think>` blocks dropped."""
    text = strip_reasoning(completion)
    tagged = extract_tagged(text, ANSWER_TAG)
    answer = (tagged if tagged is not None else text).strip()
    return answer or None
