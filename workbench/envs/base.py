"""The environment interface: a seeded, indexable prompt dataset plus a reward function.

An environment is a task: it makes prompts (a user question and the reference answer),
optionally sets a system prompt, parses a model's completion into an answer and scores it in
[0, 1]. Orchestrators use it for RL (sample, generate, reward); `workbench sft` uses its
prompts and reference answers as (prompt, completion) training pairs.

The dataset is infinite and indexable: prompt number `i` of a `(seed, split)` stream is a pure
function of those three values and the environment's arguments. An orchestrator's "data
position" is therefore one integer: checkpoint it, and resuming at that index replays exactly
the prompts that would have come next. The two splits, "train" and "eval", are disjoint by
construction (`workbench.envs.splits`): a fixed part of the task space is held out, the eval
stream draws only from it and the training stream never does.

Nothing here imports torch: rewards are pure functions and tests need no model.
"""

from __future__ import annotations

import difflib
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from workbench.envs import splits

Message = dict[str, str]

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


class EnvironmentConfigError(ValueError):
    """An unknown environment name or invalid `env_args`; the message says what to change."""


class EnvArgs(BaseModel):
    """Arguments every environment takes (`env_args` in a run's config); subclasses add theirs.

    Unknown keys are errors, so a typo in `env_args` does not silently fall back to a default.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    system_prompt: str | None = Field(
        None, description='replaces the environment\'s default system prompt; `""` removes it'
    )


@dataclass(frozen=True)
class Prompt:
    """One task instance: what the model is asked, and what a perfect answer is.

    JSON-serialisable (`to_json` / `from_json`) so an orchestrator can store it with its
    rollouts; `reward` needs nothing but this record and the completion text.
    """

    env: str
    split: str
    seed: int
    index: int
    """Position in the (seed, split) stream: the data position an orchestrator checkpoints."""
    question: str
    """The user message."""
    answer: str
    """The reference answer; also the target completion when the environment feeds SFT."""
    system_prompt: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    """Environment-specific facts the reward needs beyond `answer`."""
    chat: list[Message] | None = None
    """The whole conversation when the task comes as one (a data file's messages column);
    `question` is then its last user message."""

    @property
    def messages(self) -> list[Message]:
        """The chat to send: the system prompt (if any), then the task's conversation or its
        question. A conversation that opens with its own system message keeps it."""
        chat = list(self.chat) if self.chat else [{"role": "user", "content": self.question}]
        if self.system_prompt and chat[0].get("role") != "system":
            chat.insert(0, {"role": "system", "content": self.system_prompt})
        return chat

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Prompt:
        return cls(**data)


@dataclass(frozen=True)
class Task:
    """What `Environment.make_task` returns: the content of one prompt, before indexing."""

    question: str
    answer: str
    info: dict[str, Any] = field(default_factory=dict)
    chat: list[Message] | None = None


class Environment(ABC):
    """A task with a seeded prompt stream, an answer parser and a reward in [0, 1].

    Subclasses set `name`, `Args` (a pydantic `EnvArgs` subclass) and `default_system_prompt`,
    and implement `parse_answer`, `score` and where tasks come from: `make_task` for a
    generated task space (the stream draws from it and holds part of it out), or `task_at`
    for a finite one that decides its own order and split (a data file). Register one with
    `workbench.envs.register_environment` or name it as `package.module:ClassName`.
    """

    name: ClassVar[str]
    Args: ClassVar[type[EnvArgs]] = EnvArgs
    default_system_prompt: ClassVar[str | None] = None
    path_args: ClassVar[tuple[str, ...]] = ()
    """`env_args` keys that name files: a recipe's relative paths are made absolute against
    the recipe's folder, so every process finds the same file."""

    def __init__(self, args: EnvArgs | None = None) -> None:
        self.args = args if args is not None else self.Args()

    # ------------------------------------------------------------ what a task is

    def make_task(self, rng: random.Random) -> Task:
        """Draw one task; all randomness must come from `rng` (that is what makes it seeded)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement make_task (a generated task space) or "
            "task_at (a finite one)"
        )

    @abstractmethod
    def parse_answer(self, completion: str) -> str | None:
        """The answer contained in a completion, or None if there is none."""

    @abstractmethod
    def score(self, parsed_answer: str | None, prompt: Prompt) -> float:
        """How good a parsed answer is, in [0, 1]."""

    # ------------------------------------------------------------ derived behaviour

    @property
    def system_prompt(self) -> str | None:
        if self.args.system_prompt is not None:
            return self.args.system_prompt or None
        return self.default_system_prompt

    def reward(self, prompt: Prompt, completion: str) -> float:
        """Score a completion of `prompt`: parse, score, clamp to [0, 1]."""
        value = float(self.score(self.parse_answer(completion), prompt))
        return min(1.0, max(0.0, value))

    def task_key(self, task: Task) -> str:
        """What makes two tasks the same task: the key deciding its split. By default the
        question, so an eval question is never asked in training; override it when tasks
        that look different are the same one."""
        return task.question

    def prompt(self, index: int, *, seed: int = 0, split: str = "train") -> Prompt:
        """Prompt number `index` of the `(seed, split)` stream; the same arguments give the same
        prompt in any process."""
        if index < 0:
            raise IndexError(f"prompt index must be >= 0, got {index}")
        splits.check_split(split)
        task = self.task_at(index, seed=seed, split=split)
        return Prompt(
            env=self.name,
            split=split,
            seed=seed,
            index=index,
            question=task.question,
            answer=task.answer,
            system_prompt=self.system_prompt,
            info=dict(task.info),
            chat=[dict(message) for message in task.chat] if task.chat else None,
        )

    def task_at(self, index: int, *, seed: int, split: str) -> Task:
        """Task number `index` of the `(seed, split)` stream: by default the first task drawn
        for this index that belongs to `split`."""
        # A string seed goes through SHA-512 in `random.Random`, so it is stable across
        # processes and Python runs (unlike `hash()`), and each index gets its own draws:
        # prompt i never depends on how many prompts were drawn before it.
        stream = f"{self.name}|{split}|{seed}|{index}"
        for draw in range(splits.MAX_DRAWS):
            task = self.make_task(random.Random(stream if draw == 0 else f"{stream}|{draw}"))
            if splits.split_of(self.task_key(task)) == split:
                return task
        raise EnvironmentConfigError(
            f"environment {self.name!r}: no {split!r} prompt in {splits.MAX_DRAWS} draws; its "
            f"task space is too small to hold out 1/{splits.HELD_OUT_BUCKETS} of it for "
            "evaluation (make it larger with env_args, e.g. longer texts or a larger alphabet)"
        )

    def dataset(self, *, seed: int = 0, split: str = "train") -> PromptDataset:
        """The infinite, indexable prompt stream for `(seed, split)`."""
        return PromptDataset(self, seed=seed, split=split)

    def sample_prompts(
        self, n: int, *, seed: int = 0, start: int = 0, split: str = "train"
    ) -> list[Prompt]:
        """Prompts `start .. start + n - 1` of the `(seed, split)` stream."""
        return self.dataset(seed=seed, split=split).take(start, n)

    def close(self) -> None:
        """Let go of what the environment holds outside this process (a verifiers
        environment's process); most hold nothing."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.args!r})"


class PromptDataset:
    """An infinite, indexable view of one environment's `(seed, split)` prompt stream.

    `dataset[i]` is pure, so a consumer's place in the data is one integer it can checkpoint
    and resume from (`take(position, n)`, `iter_from(position)`).
    """

    def __init__(self, env: Environment, *, seed: int = 0, split: str = "train") -> None:
        self.env = env
        self.seed = seed
        self.split = split

    def __getitem__(self, index: int) -> Prompt:
        return self.env.prompt(index, seed=self.seed, split=self.split)

    def take(self, start: int, count: int) -> list[Prompt]:
        return [self[i] for i in range(start, start + count)]

    def iter_from(self, position: int = 0) -> Iterator[Prompt]:
        index = position
        while True:
            yield self[index]
            index += 1


# ---------------------------------------------------------------- helpers for environments


def strip_reasoning(completion: str) -> str:
    """Drop `<think>...</think>` blocks (reasoning models emit them before the answer)."""
    return _THINK_BLOCK.sub("", completion)


def extract_tagged(text: str, tag: str) -> str | None:
    """The content of the last `<tag>...</tag>` in `text` (an unclosed final tag counts), or
    None if the tag does not occur."""
    opening = f"<{tag}>"
    start = text.rfind(opening)
    if start < 0:
        return None
    content = text[start + len(opening) :]
    end = content.find(f"</{tag}>")
    return content if end < 0 else content[:end]


def similarity(answer: str | None, reference: str) -> float:
    """`difflib.SequenceMatcher` ratio in [0, 1]; a missing answer scores 0."""
    if not answer:
        return 0.0
    return difflib.SequenceMatcher(None, answer, reference).ratio()


# The longest text `random_text` makes. The pre-launch checks draw hundreds of prompts: at
# max_length = 100000 they took a minute to find that the prompts fit no context, and at
# 10**9 they would take hours and gigabytes.
MAX_TEXT_LENGTH = 10_000


def random_text(rng: random.Random, alphabet: str, min_length: int, max_length: int) -> str:
    """A random string over `alphabet` whose length is uniform in [min_length, max_length].

    Whitespace never starts or ends the text, so stripping a completion cannot hurt it.
    """
    if max_length > MAX_TEXT_LENGTH:
        raise EnvironmentConfigError(
            f"max_length = {max_length}: texts are at most {MAX_TEXT_LENGTH} characters long "
            "(longer ones fit no model's context for a task like this)"
        )
    length = rng.randint(min_length, max_length)
    chars = [rng.choice(alphabet) for _ in range(length)]
    solid = [c for c in alphabet if not c.isspace()]
    if solid:
        for end in (0, -1):
            if chars[end].isspace():
                chars[end] = rng.choice(solid)
    return "".join(chars)
